#!/usr/bin/python3
"""serve_app.py (every command it knows) plus two answers the network-core tests need.

Kiln runs it as `<this file> serve` (image `local:<this file>`), like serve_app.py. Extra
/invocations commands (a JSON object body):
  {"port": true}   answer {"port": $SAGEMAKER_BIND_TO_PORT, "address": the address it was reached at}: tells the test which of the server's
                   upstream sockets lead to this instance
  {"cut": N}       start a 200 answer that announces 2N bytes (Content-Length), write N of them,
                   then close the connection with a TCP RST (SO_LINGER 0): an upstream that resets
                   mid-response
Everything else is serve_app.py's Handler unchanged.
"""
import json
import os
import socket
import struct
import sys
import time

import serve_app


class NetCoreHandler(serve_app.Handler):
    _body = None

    def read_body(self):
        # do_POST below reads the body first; serve_app's do_POST then gets the same bytes.
        if self._body is not None:
            body, self._body = self._body, None
            return body
        return super().read_body()

    def do_POST(self):  # noqa: N802 (stdlib name)
        body = super().read_body()
        cmd = {}
        if body[:1] == b"{":
            try:
                parsed = json.loads(body)
                if isinstance(parsed, dict):
                    cmd = parsed
            except ValueError:
                pass
        if self.path == "/invocations" and cmd.get("port"):
            port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT") or 8080)
            # The address the server reached this instance at: its own on a per-instance network
            # (where every instance listens on 8080), 127.0.0.1 on the node's.
            address = self.connection.getsockname()[0]
            self.answer(200, json.dumps({"port": port, "address": address}).encode())
            return
        if self.path == "/invocations" and "cut" in cmd:
            size = int(cmd["cut"])
            self.log_message("POST /invocations cut after %d of %d bytes", size, 2 * size)
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Content-Length: %d\r\n\r\n" % (2 * size) + b"c" * size)
            self.wfile.flush()
            time.sleep(0.2)  # the head and half the body reach the proxy before the reset
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # The buffered files hold references to the socket; drop them so close() is real.
            self.rfile.close()
            self.wfile.close()
            self.connection.close()
            self.close_connection = True
            return
        self._body = body
        super().do_POST()


if __name__ == "__main__":
    serve_app.Handler = NetCoreHandler  # serve_app.main() serves with the module's Handler
    sys.exit(serve_app.main())
