/*
 * log.h - one log sink: "ts level module: message key=value ..." on stderr.
 *
 * Thread-safe (one write(2) per line). An error is logged once, where it is
 * translated into a status; callers above it do not log it again.
 */
#ifndef KF_BASE_LOG_H
#define KF_BASE_LOG_H

typedef enum kf_log_level {
    KF_LOG_DEBUG,
    KF_LOG_INFO,
    KF_LOG_WARN,
    KF_LOG_ERROR,
} kf_log_level_t;

/* Lines below `level` are dropped. Call before starting threads. */
void kf_log_set_level(kf_log_level_t level);
void kf_log(kf_log_level_t level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
