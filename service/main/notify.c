/* notify.c - sd_notify when built with libsystemd, else nothing (notify.h). */
#include "main/notify.h"

#include <stdio.h>

#include "base/log.h"

#ifdef KF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

static void notify(const char *state, const char *status) {
    char message[512];
    snprintf(message, sizeof message, "%s%sSTATUS=%s", state, state[0] ? "\n" : "", status);
    int rc = sd_notify(0, message);
    if (rc < 0) {
        /* Not fatal: the manager will time the start out and say so. */
        kf_log_kv(KF_LOG_WARN, "main", "sd_notify failed", KF_LOG_STR("state", state),
                  KF_LOG_INT("errno", -rc));
    }
}
#else
static void notify(const char *state, const char *status) {
    (void)state;
    (void)status;
}
#endif

void kf_notify_ready(const char *status) {
    notify("READY=1", status);
}

void kf_notify_stopping(const char *status) {
    notify("STOPPING=1", status);
}

void kf_notify_status(const char *status) {
    notify("", status);
}
