"""moto's server, answering one request at a time.

moto evaluates a conditional write and then stores the item with no lock, so on its
threaded server (`moto_server`) two concurrent conditional writes of one item can both
pass. Served single-threaded, every request (a conditional PutItem, UpdateItem,
TransactWriteItems) runs to its end before the next one starts: atomic as on DynamoDB,
without any serialisation on the client side. The interleaving *between* requests,
where the pipeline's races live, is untouched.

Usage: python moto_single_threaded.py -H 127.0.0.1 -p PORT
"""

import argparse
import os
import sys

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

try:  # moto >= 5.2.5; older releases serve with werkzeug's own handler
    from moto.moto_server.werkzeug_app import MotoRequestHandler
except ImportError:
    MotoRequestHandler = None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    # moto reads its own port from here (as `moto_server` sets it).
    os.environ.setdefault("MOTO_PORT", str(args.port))
    app = DomainDispatcherApplication(create_backend_app)
    # Not threaded: werkzeug then also answers HTTP/1.0 and closes each connection,
    # so no idle keep-alive connection can hold the single worker.
    options = {"request_handler": MotoRequestHandler} if MotoRequestHandler else {}
    run_simple(args.host, args.port, app, threaded=False, processes=1, **options)


if __name__ == "__main__":
    main(sys.argv[1:])
