"""The gRPC channel, transport security and per-call metadata.

Options come from keyword arguments first, then the environment:

    addr             KEYFLOW_ADDR        default 127.0.0.1:50051
    tls_ca           KEYFLOW_TLS_CA      PEM file of the CA that signed the server
    tls_cert         KEYFLOW_TLS_CERT    PEM client certificate (mTLS)
    tls_key          KEYFLOW_TLS_KEY     PEM client key (mTLS)
    tls_server_name  KEYFLOW_TLS_SERVER_NAME  name to check in the server's certificate
    tls              KEYFLOW_TLS=1       TLS with gRPC's default roots
    api_key          KEYFLOW_API_KEY     sent as `authorization: Bearer <key>`
    api_key_file     KEYFLOW_API_KEY_FILE  the key from a file (a final newline
                                         is dropped); wins over api_key, as
                                         in the CLI

Plaintext unless a TLS option is given. The channel reconnects by itself; calls fail UNAVAILABLE meanwhile.
"""

import os

import grpc

DEFAULT_ADDR = "127.0.0.1:50051"
# Matches the server's largest message (KF_REQUEST_BYTES_MAX is 20 MiB plus
# framing): an output page or a run list never trips the client's default 4 MiB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
RECONNECT_BACKOFF_MIN_MS = 100
RECONNECT_BACKOFF_MAX_MS = 2000


class KeyflowError(Exception):
    """A call keyflowd refused or could not answer. `code` is the
    grpc.StatusCode, `code_name` its name ("INVALID_ARGUMENT"), `message`
    the server's text naming the field and the limit."""

    def __init__(self, code, message):
        self.code = code
        self.code_name = code.name if code is not None else "UNKNOWN"
        self.message = message
        super().__init__("%s: %s" % (self.code_name, message))

    @classmethod
    def from_rpc(cls, err):
        return cls(err.code(), err.details() or "")


def _read(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError("%s: cannot read %s: %s" % (what, path, e.strerror)) from None


def _option(value, env):
    return value if value is not None else (os.environ.get(env) or None)


class Connection:
    """One channel and the metadata every call carries. Thread-safe."""

    def __init__(self, addr=None, tls=None, tls_ca=None, tls_cert=None, tls_key=None,
                 tls_server_name=None, api_key=None, api_key_file=None, channel_options=()):
        self.addr = _option(addr, "KEYFLOW_ADDR") or DEFAULT_ADDR
        tls_ca = _option(tls_ca, "KEYFLOW_TLS_CA")
        tls_cert = _option(tls_cert, "KEYFLOW_TLS_CERT")
        tls_key = _option(tls_key, "KEYFLOW_TLS_KEY")
        server_name = _option(tls_server_name, "KEYFLOW_TLS_SERVER_NAME")
        api_key_file = _option(api_key_file, "KEYFLOW_API_KEY_FILE")
        if api_key_file:
            api_key = _read(api_key_file, "api_key_file").decode().rstrip("\r\n")
        api_key = _option(api_key, "KEYFLOW_API_KEY")
        if tls is None:
            tls = os.environ.get("KEYFLOW_TLS", "") not in ("", "0")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key: give both for a client certificate, or neither")
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   # Reconnect soon after a keyflowd restart (gRPC's default
                   # backoff grows to 2 minutes); callers retry meanwhile.
                   ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MIN_MS),
                   ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MIN_MS),
                   ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        options.extend(channel_options)
        self.secure = bool(tls or tls_ca or tls_cert)
        if self.secure:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca, "tls_ca") if tls_ca else None,
                private_key=_read(tls_key, "tls_key") if tls_key else None,
                certificate_chain=_read(tls_cert, "tls_cert") if tls_cert else None)
            self.channel = grpc.secure_channel(self.addr, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(self.addr, options=options)
        self.metadata = (("authorization", "Bearer " + api_key),) if api_key else ()

    def close(self):
        self.channel.close()
