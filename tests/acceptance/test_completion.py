"""``contend completion bash|zsh|fish``, in the real shells: the script the CLI prints is
sourced, and its completion function is called as the shell calls it on a Tab.

bash is on every machine this runs on; zsh and fish are tried where they are installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import pytest

from contend.cli.completion import walk
from contend.cli.main import build_parser
from tests.acceptance.conftest import cli_env, run_cli

CONTEND = f"{sys.executable} -m contend"

# Each line typed so far (the word being completed last, maybe empty), and what must be offered.
CASES = [
    (["contend", "ta"], ["tasks"]),
    (["contend", "tasks", ""], ["list", "show", "retry", "cancel"]),
    (["contend", "tasks", "list", "--st"], ["--state", "--store"]),
    (["contend", "tasks", "list", "--state", "p"], ["pending"]),
    (["contend", "--log-level", "D"], ["DEBUG"]),
    (["contend", "expert", "-q", "gpu", "--ret"], ["--retention"]),  # -q's value is skipped
    (["contend", "completion", ""], ["bash", "zsh", "fish"]),
]


def _shell(shell: str, program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shell, "-c", program], capture_output=True, text=True, env=cli_env(), timeout=60
    )


def _bash_completions(words: list[str]) -> list[str]:
    """COMPREPLY after the completion function ran on *words*, as bash runs it on a Tab."""
    quoted = " ".join(f"'{w}'" for w in words)
    done = _shell(
        "bash",
        f"source <({CONTEND} completion bash) && complete -p contend && "
        f"COMP_WORDS=({quoted}) && COMP_CWORD={len(words) - 1} && "
        'COMP_LINE="${COMP_WORDS[*]}" && COMP_POINT=${#COMP_LINE} && '
        '_contend contend "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}" && '
        "printf '%s\\n' \"${COMPREPLY[@]}\"",
    )
    assert done.returncode == 0, done.stderr
    first, *offered = done.stdout.splitlines()
    assert first == "complete -o default -F _contend contend"  # `complete -p` printed it
    return [w for w in offered if w]


@pytest.mark.parametrize(("words", "offered"), CASES, ids=[" ".join(w) for w, _ in CASES])
def test_bash_completes_commands_options_and_choices(words: list[str], offered: list[str]) -> None:
    assert _bash_completions(words) == offered


def test_bash_completes_every_command_of_the_parser() -> None:
    """The script is made from the parser: a command added to the CLI is completed."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert _bash_completions(["contend", ""]) == list(sub.choices)
    assert "completion" in sub.choices
    (tasks,) = [lv for lv in walk(parser) if lv.path == "tasks show"]
    assert _bash_completions(["contend", "tasks", "show", "-"]) == [o for o, _ in tasks.options]


def _need(shell: str) -> None:
    """Skip without *shell*, except under CI=true, where a missing shell is a failure
    (scripts/install-shells.sh installs it)."""
    if shutil.which(shell) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {shell} is missing (scripts/install-shells.sh)")
        pytest.skip(f"{shell} is not installed (under CI=true this fails instead)")


def test_an_unknown_shell_is_refused() -> None:
    done = run_cli("completion", "tcsh")
    assert done.returncode == 2 and "invalid choice: 'tcsh'" in done.stderr
    assert done.stdout == ""


def test_fish_completes_commands_options_and_choices() -> None:
    _need("fish")
    lines = [" ".join(w) for w, _ in CASES]
    program = f"{CONTEND} completion fish | source; " + "; ".join(
        f"echo '## {line}'; complete -C '{line}'" for line in lines
    )
    done = _shell("fish", program)
    assert done.returncode == 0, done.stderr
    got: dict[str, list[str]] = {}
    for out in done.stdout.splitlines():
        if out.startswith("## "):
            current = got.setdefault(out[3:], [])
        else:
            current.append(out.split("\t")[0])
    for line, (_, offered) in zip(lines, CASES, strict=True):
        assert sorted(got[line]) == sorted(offered), line


def test_zsh_completes_commands_options_and_choices() -> None:
    """zsh's completion builtins exist only inside a Tab, so they are stood in for by
    functions that print what they were given; the walk through the words is the script's."""
    _need("zsh")
    stubs = (
        "compdef() { :; }; compadd() { shift; print -rl -- ${(P)1}; }; "
        "_describe() { print -rl -- ${(P)4%%:*}; }; _files() { print FILES; }; "
    )
    calls = "; ".join(
        f"words=({' '.join(repr(w) for w in words)}); CURRENT=$#words; print '## {i}'; _contend"
        for i, (words, _) in enumerate(CASES)
    )
    done = _shell("zsh", stubs + f"source <({CONTEND} completion zsh); {calls}")
    assert done.returncode == 0, done.stderr
    got: dict[int, list[str]] = {}
    for out in done.stdout.splitlines():
        if out.startswith("## "):
            current = got.setdefault(int(out[3:]), [])
        else:
            current.append(out)
    for i, (words, offered) in enumerate(CASES):
        typed = words[-1]
        assert [w for w in got[i] if w.startswith(typed)] == offered, words
