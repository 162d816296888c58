"""moto's server, answering one request at a time.

moto evaluates a conditional write and then stores the item with no lock, so on its
threaded server (`moto_server`) two concurrent conditional writes of one item can both
pass. Served single-threaded, every request (a conditional PutItem, UpdateItem,
TransactWriteItems) runs to its end before the next one starts: atomic as on DynamoDB,
without any serialisation on the client side. The interleaving *between* requests,
where the pipeline's races live, is untouched.

Four of moto's costs that grow with the suite or the backlog, not with what it
emulates, are patched (see the functions): the service lookup it repeats per request,
the whole-table copy behind every TransactWriteItems, the queue attributes computed per
message a ReceiveMessage looks at, and the message counts computed for every SendMessage.

Usage: python moto_single_threaded.py -H 127.0.0.1 -p PORT
"""

import argparse
import copy
import inspect
import os
import sys

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

try:  # moto >= 5.2.5; older releases serve with werkzeug's own handler
    from moto.moto_server.werkzeug_app import MotoRequestHandler
except ImportError:
    MotoRequestHandler = None


def cache_service_names() -> None:
    """moto resolves each request's service by listing its own package directory
    (`backends.list_of_moto_modules`: a listdir and an isdir per module, about a tenth
    of a request's time here). The list never changes while the server runs."""
    from moto import backends

    names = frozenset(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: names


def roll_back_only_touched_items() -> None:
    """moto's TransactWriteItems deep-copies every table it names before writing, to
    restore it if the transaction is cancelled: a cost in the table's size per call, so
    each call on a table of thousands of items (the hot-SKU benchmark) is slower than the
    last. The same rollback from copies of only the items the transaction names: a
    cancelled transaction leaves every item as it was, as before. Applied only to the
    moto code it was written against (the rollback it replaces, the item storage it
    restores)."""
    import moto.dynamodb.models as models
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    original = models.DynamoDBBackend.transact_write_items
    if "original_table_state" not in inspect.getsource(original) or (
        "self.items[hash_value][range_value] = item" not in inspect.getsource(Table.put_item)
    ):
        print("moto_single_threaded: TransactWriteItems left as moto has it", file=sys.stderr)
        return

    class TablesNotCopied:
        """The `copy` module as moto's DynamoDB backend sees it: a Table is not copied."""

        @staticmethod
        def deepcopy(value, memo=None):
            return value if isinstance(value, Table) else copy.deepcopy(value, memo)

        def __getattr__(self, name):
            return getattr(copy, name)

    models.copy = TablesNotCopied()

    def touched_items(backend, transact_items):
        saved = []
        for entry in transact_items:
            try:
                _, op = next(iter(entry.items()))
                table = backend.tables.get(op.get("TableName"))
                if table is None:
                    continue
                key = op["Item"] if "Item" in op else op["Key"]
                hash_value = DynamoType(key[table.hash_key_attr])
                range_value = (
                    DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
                )
                before = table.get_item(hash_value, range_value)
            except Exception:  # a malformed operation: moto itself refuses it
                continue
            saved.append((table, hash_value, range_value, copy.deepcopy(before)))
        return saved

    def restore(table, hash_value, range_value, before):
        if range_value is None:
            if before is None:
                table.items.pop(hash_value, None)
            else:
                table.items[hash_value] = before
            return
        if before is None:
            table.items[hash_value].pop(range_value, None)
            if not table.items[hash_value]:
                del table.items[hash_value]
        else:
            table.items[hash_value][range_value] = before

    def transact_write_items(self, transact_items):
        saved = touched_items(self, transact_items)
        try:
            return original(self, transact_items)
        except Exception:
            for item in reversed(saved):
                restore(*item)
            raise

    models.DynamoDBBackend.transact_write_items = transact_write_items


def retention_without_queue_counts() -> None:
    """ReceiveMessage checks each message it looks at against the queue's retention
    period by asking for the queue's attributes, and moto computes all of them for that,
    counting every message in the queue three times: a receive from a backlog of n
    messages costs n * n. The retention period is a stored setting; read it directly."""
    from moto.core.utils import unix_time
    from moto.sqs import models

    check = models.SQSBackend.is_message_valid_based_on_retention_period
    if "MessageRetentionPeriod" not in inspect.getsource(check):
        print("moto_single_threaded: the SQS retention check left as moto has it", file=sys.stderr)
        return

    def is_message_valid_based_on_retention_period(self, queue_name, message):
        retention = int(self.get_queue(queue_name).message_retention_period)
        return retention + message.sent_timestamp / 1000 > unix_time()

    models.SQSBackend.is_message_valid_based_on_retention_period = (
        is_message_valid_based_on_retention_period
    )


def send_without_queue_counts() -> None:
    """SendMessage reads one setting (content-based deduplication) from the queue's
    attributes, which moto computes in full, counting every message in the queue three
    times: a send into a backlog of n messages costs n. While a send runs, the
    attributes leave out the three approximate counts it never reads."""
    from moto.sqs import models

    counts = {
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateNumberOfMessagesNotVisible",
    }
    if not counts <= set(models.Queue.BASE_ATTRIBUTES):
        print("moto_single_threaded: SQS sends left as moto has them", file=sys.stderr)
        return
    all_attributes = models.Queue.attributes.fget
    sending = {"now": False}

    def attributes(queue):
        if not sending["now"]:
            return all_attributes(queue)
        # An instance attribute shadows the class's list for this one computation.
        queue.BASE_ATTRIBUTES = [a for a in models.Queue.BASE_ATTRIBUTES if a not in counts]
        try:
            return all_attributes(queue)
        finally:
            del queue.BASE_ATTRIBUTES

    send = models.SQSBackend.send_message

    def send_message(self, *args, **kwargs):
        sending["now"] = True
        try:
            return send(self, *args, **kwargs)
        finally:
            sending["now"] = False

    models.Queue.attributes = property(attributes)
    models.SQSBackend.send_message = send_message


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    # moto reads its own port from here (as `moto_server` sets it).
    os.environ.setdefault("MOTO_PORT", str(args.port))
    cache_service_names()
    roll_back_only_touched_items()
    retention_without_queue_counts()
    send_without_queue_counts()
    app = DomainDispatcherApplication(create_backend_app)
    # Not threaded: werkzeug then also answers HTTP/1.0 and closes each connection,
    # so no idle keep-alive connection can hold the single worker.
    options = {"request_handler": MotoRequestHandler} if MotoRequestHandler else {}
    run_simple(args.host, args.port, app, threaded=False, processes=1, **options)


if __name__ == "__main__":
    main(sys.argv[1:])
