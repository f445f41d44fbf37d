#!/usr/bin/env python3
"""A small TLS-terminating TCP proxy for the DynamoDB TLS tests.

moto's server speaks plain HTTP only; the DynamoDB store's `ca_file` option (a private CA for an
HTTPS endpoint) needs a real TLS server to be tested against. This accepts TLS on 127.0.0.1 with
the test certificate and forwards the decrypted bytes to moto. Standard library only.

    tls-proxy.py --listen 8443 --target 127.0.0.1:8000 --cert server.crt --key server.key
"""

import argparse
import socket
import ssl
import threading


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client, context, target):
    try:
        tls = context.wrap_socket(client, server_side=True)
    except (ssl.SSLError, OSError):
        # A client that refuses our certificate (the wrong-CA and wrong-host tests): nothing to do.
        client.close()
        return
    try:
        upstream = socket.create_connection(target)
    except OSError:
        tls.close()
        return
    threading.Thread(target=pipe, args=(upstream, tls), daemon=True).start()
    pipe(tls, upstream)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    a = p.parse_args()
    host, port = a.target.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(a.cert, a.key)
    listener = socket.create_server(("127.0.0.1", a.listen))
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client, context, (host, int(port))), daemon=True).start()


if __name__ == "__main__":
    main()
