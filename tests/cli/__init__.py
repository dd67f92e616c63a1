"""What the Pulumi CLI does before and around a program run, emulated from its sources.

There is no Pulumi CLI on the test machines (see ../../docs/design.md, "What the tests emulate").
Every harness that runs the program (the mocks harness, the lab executor) starts the run through
`PulumiCli.program_config`, so a project file or stack the real CLI would refuse is refused here
too, with the CLI's message, and the program receives exactly the config the CLI would give it.

    cli = PulumiCli(repo)                         # loads and validates Pulumi.yaml
    cli.stack_init("dev")                         # keeps Pulumi.dev.yaml's config
    cli.config_set("dev", "apiKey", "s3cret", secret=True)
    config = cli.program_config("dev")            # mergeConfig; raises CliError as the CLI would
    with handed_to_program(config): ...           # PULUMI_CONFIG(_SECRET_KEYS), as the exec does
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.cli import gotext
from tests.cli.project import CliError, Project, load_project
from tests.cli.stack import (
    ProgramConfig,
    StackFile,
    handed_to_program,
    may_look_like_secret,
    merge_config,
)

__all__ = ["CliError", "ProgramConfig", "PulumiCli", "handed_to_program"]


class PulumiCli:
    """One project directory and the stacks made in this session (kept in memory: the
    committed `Pulumi.<stack>.yaml` files are read, never written)."""

    def __init__(self, project_dir: Path) -> None:
        self.project: Project = load_project(Path(project_dir) / "Pulumi.yaml")
        self.stacks: dict[str, StackFile] = {}
        self.unreadable: dict[str, str] = {}  # stack -> why its file cannot be loaded

    def stack_init(self, name: str) -> StackFile:
        """`pulumi stack init NAME`: an existing `Pulumi.NAME.yaml` is kept as it is."""
        return self._loaded(name, lambda: StackFile.load(self.project, name))

    def stack_from(self, name: str, config: Mapping[str, Any]) -> StackFile:
        """A stack whose `Pulumi.NAME.yaml` has this `config:` block (keys as in the file).

        A value config.Value cannot hold (an infinite float: json.Marshal refuses it) fails
        LoadProjectStackBytes; preview and up then stop with "getting stack configuration: "
        and that error (pkg/cmd/pulumi/operations/up.go, preview.go)."""
        return self._loaded(name, lambda: StackFile.from_config(self.project, name, config))

    def _loaded(self, name: str, load: Callable[[], StackFile]) -> StackFile:
        try:
            self.stacks[name] = load()
        except gotext.GoTextError as error:
            self.unreadable[name] = str(error)
            self.stacks[name] = StackFile(name)
        return self.stacks[name]

    def config_set(
        self,
        stack: str,
        key: str,
        value: str,
        secret: bool = False,
        path: bool = False,
        plaintext: bool = False,
    ) -> None:
        """`pulumi config set [--secret | --plaintext] [--path] KEY VALUE` on a stack made
        before."""
        if stack not in self.stacks:
            raise CliError(f"no stack named '{stack}' found")
        if not secret and not plaintext and may_look_like_secret(key, path):
            raise CliError(
                f"tests/cli cannot tell whether `pulumi config set {key}` is refused: the CLI "
                "refuses a plain value that looks like a secret (config.go looksLikeSecret: "
                "the key's name matches, then the value's zxcvbn-go entropy decides, which is "
                "not ported); set it with secret=True, or plaintext=True as --plaintext does"
            )
        if path:
            self.stacks[stack].set_path(self.project, key, value, secret=secret)
        else:
            self.stacks[stack].set(self.project, key, value, secret=secret)

    def program_config(self, stack: str) -> ProgramConfig:
        """What preview, up, refresh and destroy do before the program starts."""
        if stack not in self.stacks:
            raise CliError(f"no stack named '{stack}' found")
        if stack in self.unreadable:
            raise CliError(f"getting stack configuration: {self.unreadable[stack]}")
        return merge_config(self.project, self.stacks[stack])
