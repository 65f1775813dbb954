# SPDX-License-Identifier: Apache-2.0
"""RpcPool: the executor vgpud's gRPC server runs its handlers on (what gRPC asks of one:
submit, and a done-callback on what it returns)."""
from __future__ import annotations

import logging
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from arbiter.daemon.rpc_pool import RpcPool


@pytest.fixture
def pool():
    p = RpcPool(2, "test-rpc")
    yield p
    p.shutdown()


def test_calls_run_on_the_pools_named_threads(pool: RpcPool) -> None:
    names: list[str] = []
    ran = threading.Event()
    pool.submit(lambda a, b=0: (names.append(threading.current_thread().name + f":{a + b}"),
                                ran.set()), 1, b=2)
    assert ran.wait(10)
    assert names in (["test-rpc_0:3"], ["test-rpc_1:3"])


def test_a_done_callback_runs_once_the_call_has_returned(pool: RpcPool) -> None:
    release, order = threading.Event(), []
    finished = threading.Event()
    call = pool.submit(lambda: (release.wait(10), order.append("call")))
    call.add_done_callback(lambda c: (order.append("callback"), finished.set()))
    assert order == []  # the call waits: no callback yet
    release.set()
    assert finished.wait(10)
    assert order == ["call", "callback"]
    # Added after the call is done: run at once, in the caller.
    late: list[str] = []
    call.add_done_callback(lambda c: late.append(threading.current_thread().name))
    assert late == [threading.current_thread().name]


def test_a_call_that_raises_is_logged_and_the_worker_goes_on(
        pool: RpcPool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="arbiter.daemon.rpc_pool")
    done = [threading.Event() for _ in range(4)]

    def boom() -> None:
        raise RuntimeError("handler failed")

    for d in done:  # more failing calls than workers: each worker fails and carries on
        pool.submit(boom).add_done_callback(lambda c, d=d: d.set())
    assert all(d.wait(10) for d in done)
    said = [r for r in caplog.records if r.getMessage() == "an RPC handler raised past gRPC"]
    assert len(said) == 4
    assert all(r.exc_info and "handler failed" in str(r.exc_info[1]) for r in said)
    ok = threading.Event()
    pool.submit(ok.set)
    assert ok.wait(10)


def test_shutdown_ends_the_threads_and_refuses_more() -> None:
    p = RpcPool(3, "test-rpc")
    threads = list(p._threads)
    p.shutdown()
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError, match="after the pool was shut down"):
        p.submit(print)
    p.shutdown()  # twice: nothing more


def test_a_grpc_server_on_it_counts_its_calls_done(tmp_path: Path) -> None:
    """gRPC's server learns a call is over from the done-callback: with at most 8 calls at
    once, 5 rounds of 8 are all served (none refused as over the limit: a call whose end it
    never heard of would count against that limit for good)."""
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request[::-1]

    handler = grpc.method_handlers_generic_handler("t.Echo", {
        "Call": grpc.unary_unary_rpc_method_handler(echo)})
    pool = RpcPool(2, "test-rpc")
    server = grpc.server(pool, handlers=[handler],  # type: ignore[arg-type]
                         maximum_concurrent_rpcs=8)
    sock = tmp_path / "echo.sock"
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            call = ch.unary_unary("/t.Echo/Call")
            for round_ in range(5):
                with futures.ThreadPoolExecutor(8) as clients:
                    asks = [f"{round_}-{i}".encode() for i in range(8)]
                    got = list(clients.map(lambda ask: call(ask, timeout=10), asks))
                assert got == [ask[::-1] for ask in asks]
    finally:
        server.stop(None).wait()
        pool.shutdown()
