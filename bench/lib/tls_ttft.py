#!/usr/bin/env python3
"""SSE time to first event over TLS: bench/lib/ttft.py with its connections wrapped in TLS.

Same flags, measurement and JSON output as ttft.py (N sequential POSTs on one kept-alive
connection, reconnecting when the peer closes). The TLS handshake happens when a connection is
opened, before the request's clock starts, so TTFT here is the time from sending the request on an
established TLS connection to the first event: what TLS adds is record encryption and decryption
on both legs of the proxy's client side, not the handshake. The certificate is not verified (the
bench's certificates are self-signed); ALPN offers http/1.1.
"""
import socket
import ssl

import ttft

CTX = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
CTX.check_hostname = False
CTX.verify_mode = ssl.CERT_NONE
CTX.set_alpn_protocols(["http/1.1"])


class TLSConn(ttft.Conn):
    def ensure(self):
        if self.sock is None:
            s = socket.create_connection((self.host, self.port), timeout=5)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = CTX.wrap_socket(s, server_hostname="localhost")
        return self.sock


if __name__ == "__main__":
    ttft.Conn = TLSConn
    ttft.main()
