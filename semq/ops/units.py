"""A node of several units (semq.umxt_protocol.units): ``semq node run`` on such a node
starts one process per unit (``semq node run --unit K``), restarts a unit
that dies, and stops them all on SIGTERM or SIGINT (each drains as a node
does alone). SIGHUP is passed on (each unit reloads its configuration).

A unit that exits with status 0 (``semq admin stop`` or a drain) is not
started again; once every unit has stopped so, ``semq node run`` exits 0.

A unit is a whole node process with its own store, admin socket and status
(``unit-K/`` in the data directory; unit 1 keeps the directory's own files).
Its lines on standard output come out here prefixed ``[unit K]``; its log
goes to the same standard error. If the supervisor itself dies, each unit
notices within a second (``watch_supervisor``: its parent changed) and
stops as on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import trio

from .service import semq_command

__all__ = ["RESTART_DELAY", "STEADY_S", "SUPERVISOR_ENV", "supervise_units", "watch_supervisor"]

log = logging.getLogger("semq.ops.units")

RESTART_DELAY: Final = 1.0  # s before a unit that died is started again (doubling while it keeps dying)
RESTART_DELAY_MAX: Final = 30.0
STEADY_S: Final = 10.0  # a unit that ran this long had started well: the next restart waits RESTART_DELAY again
SUPERVISOR_ENV: Final = "SEMQ_UNIT_SUPERVISOR"  # the supervisor's pid, in each unit's environment


def watch_supervisor(interval: float = 0.5) -> None:
    """In a unit started by ``supervise_units``: when the supervisor is gone
    (this process's parent is no longer the pid it was given), stop as on
    SIGTERM (drain, exit 0). A thread, polling: a kernel death signal
    (PR_SET_PDEATHSIG) follows the thread that forked, which in trio is a
    worker thread that ends when idle."""
    want = os.environ.get(SUPERVISOR_ENV, "")
    if not want.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(want):
            time.sleep(interval)
        log.warning("the supervisor (pid %s) is gone: stopping this unit", want)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="semq-unit-supervisor", daemon=True).start()


class _Units:
    def __init__(self, org: str, argv: Sequence[str], units: int, stop_timeout: float) -> None:
        self.org = org
        self.argv = list(argv)
        self.units = units
        self.stop_timeout = stop_timeout
        self.procs: dict[int, Any] = {}
        self.ready: set[int] = set()
        self.all_ready = trio.Event()
        self.stopping = False
        self.restarts = 0
        self.stopped: set[int] = set()  # units that exited 0 (stopped by the operator)
        self.all_stopped = trio.Event()

    def command(self, unit: int) -> list[str]:
        return [*semq_command(), *self.argv, "--unit", str(unit)]

    async def run_unit(self, unit: int) -> None:
        delay = RESTART_DELAY
        while not self.stopping:
            started = time.monotonic()
            proc = await trio.lowlevel.open_process(
                self.command(unit), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                env={**os.environ, SUPERVISOR_ENV: str(os.getpid())})
            self.procs[unit] = proc
            assert proc.stdout is not None
            buf = b""
            try:
                async for chunk in proc.stdout:
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        text = line.decode("utf-8", "replace")
                        print(f"[unit {unit}] {text}", flush=True)
                        if unit not in self.ready and " running" in text:
                            self.ready.add(unit)
                            if len(self.ready) == self.units:
                                self.all_ready.set()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            rc = await proc.wait()
            self.procs.pop(unit, None)
            if self.stopping:
                return
            if rc == 0:
                # Stopped on purpose ('semq admin stop', a drain): not started
                # again (as systemd's Restart=on-failure); when every unit has
                # stopped so, the node has.
                log.info("unit %d of node %s stopped", unit, self.org)
                self.stopped.add(unit)
                if len(self.stopped) == self.units:
                    self.all_stopped.set()
                return
            if time.monotonic() - started >= STEADY_S:
                delay = RESTART_DELAY
            self.restarts += 1
            log.warning("unit %d of node %s exited with status %s: starting it again in %.0f s",
                        unit, self.org, rc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RESTART_DELAY_MAX)

    def signal_all(self, sig: int) -> None:
        for proc in list(self.procs.values()):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass

    async def stop(self) -> None:
        self.stopping = True
        self.signal_all(signal.SIGTERM)
        with trio.move_on_after(self.stop_timeout):
            while self.procs:
                await trio.sleep(0.05)
        if self.procs:
            log.warning("units %s did not stop within %.0f s: killed",
                        ", ".join(map(str, sorted(self.procs))), self.stop_timeout)
            self.signal_all(signal.SIGKILL)


def supervise_units(org: str, argv: Sequence[str], units: int, *, platform: str, stop_timeout: float = 90.0) -> int:
    """Run the node's ``units`` unit processes (``semq <argv> --unit K``)
    until SIGTERM or SIGINT; returns 0 once every one has stopped."""
    sup = _Units(org, argv, units, stop_timeout)

    async def amain() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                for k in range(1, units + 1):
                    nursery.start_soon(sup.run_unit, k)

                async def announce() -> None:
                    await sup.all_ready.wait()
                    print(f"node {org} running as {units} units (platform {platform}); pid {os.getpid()}",
                          flush=True)
                nursery.start_soon(announce)

                async def until_signal(scope: trio.CancelScope) -> None:
                    async for sig in signals:
                        if sig == signal.SIGHUP:
                            sup.signal_all(signal.SIGHUP)
                            continue
                        log.info("signal %d: stopping the units", sig)
                        break
                    scope.cancel()

                async with trio.open_nursery() as waiting:
                    waiting.start_soon(until_signal, waiting.cancel_scope)
                    await sup.all_stopped.wait()  # (every unit stopped by the operator)
                    waiting.cancel_scope.cancel()
                await sup.stop()
                nursery.cancel_scope.cancel()

    trio.run(amain)
    return 0
