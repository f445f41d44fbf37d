"""moto's DynamoDB emulator, one request at a time.

moto's own `moto_server` answers each connection on its own thread and its DynamoDB model takes no
lock, so two conditional writes of one item can both pass their condition (DynamoDB never allows
that; the conformance suite's concurrent compare-and-set case catches it). This wrapper runs the
same server with every request handled under one lock: connections stay concurrent, requests are
applied one after another, as DynamoDB applies writes to one item.

usage: python moto-server.py -H 127.0.0.1 -p PORT   (the arguments of moto_server)
"""
import sys
import threading

import moto.server as server

_run_simple = server.run_simple
_lock = threading.Lock()


def _serialized(app):
    def wrapped(environ, start_response):
        with _lock:
            return list(app(environ, start_response))

    return wrapped


def _run_simple_serialized(host, port, app, **kwargs):
    return _run_simple(host, port, _serialized(app), **kwargs)


server.run_simple = _run_simple_serialized

if __name__ == "__main__":
    server.main(sys.argv[1:])
