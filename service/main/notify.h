/*
 * notify.h - telling a service manager where keyflowd is in its life
 * (systemd's Type=notify protocol, through libsystemd's sd_notify):
 *
 *   READY=1     both listeners accept and the engine serves (after recovery,
 *               which can take minutes: `systemctl start` waits for this)
 *   STOPPING=1  SIGTERM arrived; the drain and the stop begin
 *   STATUS=...  a line `systemctl status` shows
 *
 * Without $NOTIFY_SOCKET (not started by systemd with Type=notify) every
 * call does nothing, as does a build without libsystemd (KF_HAVE_SYSTEMD
 * undefined: libsystemd-dev was absent at configure time). Main thread.
 */
#ifndef KF_MAIN_NOTIFY_H
#define KF_MAIN_NOTIFY_H

/* `status` is borrowed for the call. */
void kf_notify_ready(const char *status);
void kf_notify_stopping(const char *status);
void kf_notify_status(const char *status);

#endif
