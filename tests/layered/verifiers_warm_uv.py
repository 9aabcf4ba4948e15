"""Prepare the ``null`` harness's chat program (a PEP 723 script that verifiers 0.4.0 runs
with ``uv``) once, in one event loop, before the checks run.

On a cold uv cache the preparation downloads its dependencies while a rollout in another
event loop waits on the same ``asyncio.Lock`` (``runtimes/base.py``,
``prepare_uv_script``), and verifiers fails every rollout with "... is bound to a
different event loop". With the script's environment in the uv cache the preparation is
quick and the race does not arise. Run by ``tests/test_integration_verifiers.py`` with the
layer's interpreter.
"""

import asyncio

from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime


async def main() -> None:
    runtime = SubprocessRuntime(SubprocessConfig())
    await runtime.start()
    try:
        await runtime.prepare_uv_script(CHAT_PROGRAM_SOURCE, {})
    finally:
        await runtime.stop()


if __name__ == "__main__":
    asyncio.run(main())
