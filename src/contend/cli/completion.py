"""``contend completion bash|zsh|fish``: a shell completion script for the CLI.

The script is made from the argparse parser itself (:func:`walk`), so a command or option
added to the CLI is completed without anyone editing the script. It is static: completing
never runs ``contend`` (which would import the app and take a second a keystroke).

Each script holds the same data, written in its shell's words: for every command path
(``""``, ``"tasks"``, ``"tasks list"``…) the words that may follow (subcommands, or the choices
of a positional argument), its options, the options that take a value and their choices. A
small function walks the words typed so far through that data: a known subcommand moves down
a level, an option that takes a value skips the next word.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from contend.cli.common import Subcommands

SHELLS = ("bash", "zsh", "fish")
#: The most characters of a help text a description shows.
DESCRIPTION_CHARS = 70


@dataclass
class Level:
    """One command path of the CLI and what may be typed after it."""

    path: str  # the subcommands from the top, space-separated ("" for contend itself)
    words: list[tuple[str, str]] = field(default_factory=list)  # (subcommand or choice, help)
    options: list[tuple[str, str]] = field(default_factory=list)  # (option string, help)
    takes_value: list[str] = field(default_factory=list)  # the options followed by a value
    choices: dict[str, list[str]] = field(default_factory=dict)  # option → its choices


def _described(text: str | None) -> str:
    """A help text as a one-line description: its first clause, without argparse's holes."""
    if not text or text == argparse.SUPPRESS:
        return ""
    text = re.sub(r"\s+", " ", text.replace("%%", "%")).strip()
    text = re.split(r"[;(]| \(", text, maxsplit=1)[0].strip().rstrip(",:")
    return text if len(text) <= DESCRIPTION_CHARS else text[: DESCRIPTION_CHARS - 1] + "…"


def walk(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Level]:
    """Every level of *parser*, depth first: its own, then each of its subcommands'."""
    level = Level(path)
    below: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                level.words.append((name, _described(helps.get(name))))
                below.append((name, sub))
        elif not action.option_strings:
            level.words += [(str(c), "") for c in action.choices or ()]
        else:
            for option in action.option_strings:
                level.options.append((option, _described(action.help)))
                if action.nargs != 0:
                    level.takes_value.append(option)
                    if action.choices:
                        level.choices[option] = [str(c) for c in action.choices]
    yield level
    for name, sub in below:
        yield from walk(sub, f"{path} {name}".strip())


# -- bash and zsh: the same data functions (POSIX case statements) -------------------------------
def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _lines(items: list[str]) -> str:
    return "printf '%s\\n' " + " ".join(_sh(i) for i in items) if items else ":"


def _case(name: str, arms: list[tuple[str, str]]) -> str:
    """A shell function that prints the lines of the arm its arguments match (none: none)."""
    body = "".join(f"    {_sh(key)}) {out} ;;\n" for key, out in arms if out != ":")
    return f'{name}() {{\n  case "$1|$2" in\n{body}  esac\n}}\n'


def _sh_data(levels: list[Level]) -> str:
    def described(pairs: list[tuple[str, str]]) -> list[str]:
        return [f"{w}:{d}" if d else w for w, d in pairs]

    parts = [
        _case("_contend_words", [(f"{lv.path}|", _lines([w for w, _ in lv.words])) for lv in levels]),
        _case("_contend_words_described", [(f"{lv.path}|", _lines(described(lv.words))) for lv in levels]),
        _case("_contend_options", [(f"{lv.path}|", _lines([o for o, _ in lv.options])) for lv in levels]),
        _case("_contend_options_described", [(f"{lv.path}|", _lines(described(lv.options))) for lv in levels]),
        _case("_contend_choices", [(f"{lv.path}|{o}", _lines(c)) for lv in levels for o, c in lv.choices.items()]),
    ]  # fmt: skip
    values = [f"{lv.path}|{o}" for lv in levels for o in lv.takes_value]
    parts.append(
        '_contend_takes_value() {\n  case "$1|$2" in\n'
        + "".join(f"    {_sh(v)}) return 0 ;;\n" for v in values)
        + "  esac\n  return 1\n}\n"
    )
    return "".join(parts)


BASH_MAIN = r"""
# The words typed so far, walked through the data above: _contend_path is the command path,
# _contend_want the option whose value is being typed (empty if none).
_contend_walk() {
  _contend_path="" _contend_want=""
  local i=1 w c
  while (( i < COMP_CWORD )); do
    w=${COMP_WORDS[i]}
    if [[ $w == -* ]]; then
      if [[ $w != *=* ]] && _contend_takes_value "$_contend_path" "$w"; then
        if (( i + 1 == COMP_CWORD )); then _contend_want=$w; return; fi
        (( i++ ))
      fi
    else
      for c in $(_contend_words "$_contend_path"); do
        if [[ $w == "$c" ]]; then _contend_path=${_contend_path:+$_contend_path }$w; break; fi
      done
    fi
    (( i++ ))
  done
}

_contend() {
  local cur=${COMP_WORDS[COMP_CWORD]} _contend_path _contend_want
  _contend_walk
  COMPREPLY=()
  if [[ -n $_contend_want ]]; then
    COMPREPLY=( $(compgen -W "$(_contend_choices "$_contend_path" "$_contend_want")" -- "$cur") )
  elif [[ $cur == -* ]]; then
    COMPREPLY=( $(compgen -W "$(_contend_options "$_contend_path")" -- "$cur") )
  else
    COMPREPLY=( $(compgen -W "$(_contend_words "$_contend_path")" -- "$cur") )
  fi
}

complete -o default -F _contend contend
"""

ZSH_MAIN = r"""
_contend() {
  local cmdpath="" want="" w c i=2
  while (( i < CURRENT )); do
    w=${words[i]}
    if [[ $w == -* ]]; then
      if [[ $w != *=* ]] && _contend_takes_value "$cmdpath" "$w"; then
        if (( i + 1 == CURRENT )); then want=$w; break; fi
        (( i++ ))
      fi
    else
      for c in ${(f)"$(_contend_words "$cmdpath")"}; do
        if [[ $w == "$c" ]]; then cmdpath=${cmdpath:+$cmdpath }$w; break; fi
      done
    fi
    (( i++ ))
  done
  local -a found
  if [[ -n $want ]]; then
    found=(${(f)"$(_contend_choices "$cmdpath" "$want")"})
    if (( $#found )); then compadd -a found; else _files; fi
  elif [[ ${words[CURRENT]} == -* ]]; then
    found=(${(f)"$(_contend_options_described "$cmdpath")"})
    _describe -t options option found
  else
    found=(${(f)"$(_contend_words_described "$cmdpath")"})
    if (( $#found )); then _describe -t commands command found; else _files; fi
  fi
}

if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
  _contend "$@"  # autoloaded from a file _contend in $fpath
else
  compdef _contend contend  # sourced: source <(contend completion zsh)
fi
"""


def bash_script(levels: list[Level]) -> str:
    return (
        "# contend completion bash: source <(contend completion bash)\n"
        + _sh_data(levels)
        + BASH_MAIN
    )


def zsh_script(levels: list[Level]) -> str:
    return "#compdef contend\n# contend completion zsh\n" + _sh_data(levels) + ZSH_MAIN


# -- fish: its own syntax, and its own way with options -------------------------------------------
def _fish(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


FISH_PATH = r"""
# The command path of the words typed so far (a subcommand moves down a level; an option that
# takes a value skips the next word).
function __contend_path
    set -l path ''
    set -l skip 0
    for w in (commandline -opc)[2..-1]
        if test $skip = 1
            set skip 0
        else if string match -q -- '-*' $w
            if not string match -q -- '*=*' $w; and __contend_takes_value "$path" $w
                set skip 1
            end
        else if contains -- $w (__contend_words "$path")
            set path (string trim -- "$path $w")
        end
    end
    echo $path
end

function __contend_at
    set -l path (__contend_path)
    test "$path" = "$argv[1]"
end
"""


def _fish_words(levels: list[Level]) -> str:
    """``__contend_words PATH``: the words that may follow PATH, one a line."""
    out = ["function __contend_words", '    switch "$argv[1]"']
    for lv in levels:
        if lv.words:
            out.append(f"        case {_fish(lv.path)}")
            out.append("            printf '%s\\n' " + " ".join(_fish(w) for w, _ in lv.words))
    return "\n".join([*out, "    end", "end", ""])


def _fish_takes_value(levels: list[Level]) -> str:
    """``__contend_takes_value PATH OPTION``: whether OPTION, after PATH, is followed by a value."""
    pairs = " ".join(_fish(f"{lv.path}|{o}") for lv in levels for o in lv.takes_value)
    return "\n".join(
        [
            "function __contend_takes_value",
            "    switch (string join '|' -- $argv)",
            f"        case {pairs}",
            "            return 0",
            "    end",
            "    return 1",
            "end",
            "",
        ]
    )


def _fish_option(level: Level, option: str, help: str) -> str:
    if option.startswith("--"):
        flag = f"-l {_fish(option[2:])}"
    elif len(option) == 2:
        flag = f"-s {_fish(option[1:])}"
    else:
        flag = f"-o {_fish(option[1:])}"
    line = f"complete -c contend -n {_fish('__contend_at ' + _fish(level.path))} {flag}"
    if option in level.takes_value:
        line += " -r"
        if option in level.choices:
            line += f" -f -a {_fish(' '.join(level.choices[option]))}"
    return line + (f" -d {_fish(help)}" if help else "")


def fish_script(levels: list[Level]) -> str:
    lines = ["# contend completion fish: contend completion fish | source", ""]
    lines += [_fish_words(levels), _fish_takes_value(levels)]
    lines.append(FISH_PATH)
    lines.append("complete -c contend -e")
    for lv in levels:
        at = _fish("__contend_at " + _fish(lv.path))
        for word, help in lv.words:
            desc = f" -d {_fish(help)}" if help else ""
            lines.append(f"complete -c contend -f -n {at} -a {_fish(word)}{desc}")
        lines += [_fish_option(lv, option, help) for option, help in lv.options]
    return "\n".join(lines) + "\n"


SCRIPTS = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    return SCRIPTS[shell](list(walk(parser)))


def add_parser(sub: Subcommands) -> None:
    c = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script of contend's commands and options. bash: "
        "`source <(contend completion bash)` in ~/.bashrc; zsh: `source <(contend completion "
        "zsh)` in ~/.zshrc after compinit; fish: `contend completion fish > "
        "~/.config/fish/completions/contend.fish`.",
    )
    c.add_argument("shell", choices=SHELLS)
    c.set_defaults(func=cmd_completion)


async def cmd_completion(args: argparse.Namespace) -> int:
    from contend.cli.main import build_parser  # main builds its parser from this module

    sys.stdout.write(script(args.shell, build_parser()))
    return 0
