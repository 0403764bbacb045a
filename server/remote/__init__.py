"""The client side of WorkerService: a Python process running jobs for a server.

`leasehold.worker.Worker` (worker.py) claims jobs over gRPC and runs them with the
same `AttemptExecutor` and `JobContext` as the in-process runtime; only the store
behind them differs (store.py), so a handler module behaves the same in both.
"""
