"""`pulumi-language-python` where the proxy serves none: the Python SDK's own language runtime
server (pulumi.automation._server.LanguageServer, what the Automation API runs an inline program
with) running the project's `__main__.py` in this process.

What differs from the real host (sdk/python/cmd/pulumi-language-python): it runs the program in
its own process instead of a child `python -u pulumi-language-python-exec`, reports no required
plugins (the engine loads each provider when the program first registers it), and does not run
`uv sync` for `toolchain: uv` (the lab's venv is synced by scripts/setup-dev.sh).
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
from typing import Any

from google.protobuf import empty_pb2
from pulumi.automation._server import LanguageServer
from pulumi.runtime.proto import language_pb2, language_pb2_grpc

from tests.lab.plugins.plugin import configure_logging, serve

log = logging.getLogger("language")


class ProjectLanguageServer(LanguageServer):
    """Runs `<program directory>/__main__.py` as the real host's exec script does."""

    def __init__(self, engine_address: str) -> None:
        super().__init__(self._program)
        self.engine_address = engine_address
        self.program_dir = os.getcwd()

    def _program(self) -> None:
        main = os.path.join(self.program_dir, "__main__.py")
        if self.program_dir not in sys.path:
            sys.path.insert(0, self.program_dir)
        runpy.run_path(main, run_name="__main__")

    def Run(self, request: Any, context: Any) -> Any:
        info = request.info
        self.program_dir = (
            info.program_directory or info.root_directory or request.pwd or os.getcwd()
        )
        os.chdir(self.program_dir)
        log.info("run %s/%s in %s (dry run %s)", request.project, request.stack,
                 self.program_dir, request.dryRun)  # fmt: skip
        # LanguageServer takes the engine's address from the program's first argument (the
        # Automation API passes none): the program's log reaches the CLI through the engine.
        forwarded = language_pb2.RunRequest()
        forwarded.CopyFrom(request)
        del forwarded.args[:]
        forwarded.args.append(self.engine_address)
        return super().Run(forwarded, context)

    def Cancel(self, request: Any, context: Any) -> Any:
        """The engine's last call before it ends the plugin: nothing to stop here."""
        return empty_pb2.Empty()


def main(argv: list[str]) -> None:
    configure_logging("pulumi-language-python")
    words = [word for word in argv if not word.startswith("-")]
    engine_address = words[-1] if words else ""
    serve(
        language_pb2_grpc.add_LanguageRuntimeServicer_to_server,
        ProjectLanguageServer(engine_address),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
