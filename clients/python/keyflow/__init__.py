"""keyflow: a Python client and run worker for keyflowd.

    import keyflow
    client = keyflow.Client("127.0.0.1:50051")
    receipt = client.send_event("ship", "order-7", {"item": 1},
                                rule=keyflow.batch(max_events=3, max_wait_ms=60000))

    worker = keyflow.Worker(client, concurrency=16)
    worker.handle("ship", lambda input, run: {"shipped": len(input)})
    worker.run()

The gRPC stubs under keyflow/v1 are generated from the protos by
keyflow_build.py (the CMake build and `pip install` run it); see README.md.
"""

from ._connection import KeyflowError
from ._convert import Record
from .client import Client, OutputTail, Producer, batch, debounce, retry
from .handler import (Activation, FunctionWorker, HandlerError, implementation_digest,
                      remote_descriptor, with_placement)
from .worker import RetryableError, RunContext, Worker

__all__ = ["Activation", "Client", "FunctionWorker", "HandlerError", "KeyflowError",
           "OutputTail", "Producer", "Record", "RetryableError", "RunContext", "Worker", "batch",
           "debounce", "implementation_digest", "remote_descriptor", "retry", "with_placement"]
