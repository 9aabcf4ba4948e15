"""An asyncio micro-batcher: many concurrent coroutines, one batched call.

Trainers such as verl ask for the simulated user's turn one dialogue (one coroutine) at
a time, while the user's backend is fastest with all dialogues at once. The batch
function runs in a worker thread, so the event loop keeps serving the policy. Each
request may wait up to ``window_s`` before its batch starts, and batches run one at a
time (which also keeps backends that are not thread-safe to one call at a time); for a
backend that serves single requests in parallel anyway, ``max_batch=1`` and
``window_s=0`` give one thread per request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class MicroBatcher(Generic[Item, Result]):
    """Group concurrent :meth:`submit` calls into calls of ``batch_fn``.

    Args:
        batch_fn: a blocking function from a list of items to a list of results of the
            same length, the i-th result for the i-th item. Runs in a worker thread.
        window_s: how long, in seconds (>= 0), to wait for more items after the first
            one of a batch arrives. 0 batches only what is already queued.
        max_batch: the most items per call (>= 1); a full batch starts at once.

    Raises:
        ValueError: ``window_s < 0`` or ``max_batch < 1``.

    One batcher serves one event loop at a time; from a new loop (a second
    ``asyncio.run``) it starts afresh. If ``batch_fn`` raises, every caller of that batch
    gets the exception.

    Example:
        >>> batcher = MicroBatcher(lambda xs: [x * 2 for x in xs], window_s=0.005)
        >>> async def main():
        ...     return await asyncio.gather(*(batcher.submit(i) for i in range(3)))
        >>> asyncio.run(main())      # one call of batch_fn with [0, 1, 2]
        [0, 2, 4]
    """

    def __init__(
        self, batch_fn: Callable[[list[Item]], Sequence[Result]], *, window_s: float = 0.005, max_batch: int = 64
    ):
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0 seconds, got {window_s}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.batch_fn = batch_fn
        self.window_s = float(window_s)
        self.max_batch = int(max_batch)
        #: the sizes of the last 1024 batches run (bounded: a server runs for weeks)
        self.batch_sizes: deque[int] = deque(maxlen=1024)
        #: batches run and items they held, since the start
        self.batches, self.items = 0, 0
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def submit(self, item: Item) -> Result:
        """Queue ``item`` and wait for its result (or the batch's exception)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a new event loop: start afresh
            self._loop, self._queue, self._drainer = loop, [], None
        future: asyncio.Future[Result] = loop.create_future()
        self._queue.append((item, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Run batches until the queue is empty, one at a time."""
        while self._queue:
            if len(self._queue) < self.max_batch and self.window_s > 0:
                await asyncio.sleep(self.window_s)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            self.batch_sizes.append(len(batch))
            self.batches, self.items = self.batches + 1, self.items + len(batch)
            try:
                results = await asyncio.to_thread(self.batch_fn, [item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch_fn returned {len(results)} results for {len(batch)} items")
            except asyncio.CancelledError:  # the loop is shutting down: cancel the callers
                for _, future in batch:
                    future.cancel()
                raise
            except Exception as error:  # hand the failure to every caller of this batch
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)
