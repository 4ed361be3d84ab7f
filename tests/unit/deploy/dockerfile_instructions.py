"""A small reader for Dockerfiles and .dockerignore files, enough to check what they promise.

It follows the Dockerfile reference for what the checks need: line
continuations, comments, JSON (exec) form arguments, and the last stage's
instructions; and the .dockerignore rules (Go filepath.Match per path
segment, `**` for any number of segments, a pattern also covering what is
below a matched directory, `!` re-including, the last matching rule wins).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case, e.g. "HEALTHCHECK"
    arguments: str  # the rest of the logical line, continuations joined


def read_instructions(path: Path) -> list[Instruction]:
    """Every instruction of the Dockerfile, in order, continuation lines joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw_line in path.read_text().splitlines():
        line = raw_line.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction is dropped
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        keyword, _, arguments = logical.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the last build stage: the image that runs."""
    starts = [index for index, instruction in enumerate(instructions) if instruction.keyword == "FROM"]
    return instructions[starts[-1]:]


def exec_form(arguments: str) -> list[str]:
    """A JSON-array argument list (`["mmserve", "serve"]`); a shell form is an error here."""
    parsed = json.loads(arguments)
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        raise ValueError(f"not an exec-form argument list: {arguments}")
    return parsed


def env_assignments(instructions: list[Instruction]) -> dict[str, str]:
    """ENV KEY=VALUE pairs in effect at the end of ``instructions`` (later ones win)."""
    env: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ENV":
            for token in shlex.split(instruction.arguments):
                key, sep, value = token.partition("=")
                if not sep:
                    raise ValueError(f"use ENV KEY=VALUE, not the legacy form: {instruction.arguments}")
                env[key] = value
    return env


@dataclass(frozen=True)
class Healthcheck:
    options: dict[str, str]  # e.g. {"interval": "15s", "start-period": "600s"}
    command: list[str]


def healthcheck(instructions: list[Instruction]) -> Healthcheck:
    found = [instruction for instruction in instructions if instruction.keyword == "HEALTHCHECK"]
    if not found:
        raise LookupError("no HEALTHCHECK")
    options: dict[str, str] = {}
    rest = found[-1].arguments
    while rest.startswith("--"):
        option, _, rest = rest.partition(" ")
        name, _, value = option[2:].partition("=")
        options[name] = value
        rest = rest.strip()
    keyword, _, command = rest.partition(" ")
    if keyword.upper() != "CMD":
        raise ValueError(f"HEALTHCHECK without CMD: {found[-1].arguments}")
    return Healthcheck(options, exec_form(command.strip()))


def duration_s(text: str) -> float:
    """A Docker duration such as ``600s``, ``10m`` or ``1m30s`` in seconds."""
    units_s = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(number) * units_s[unit] for number, unit in parts)


def copy_sources(instructions: list[Instruction]) -> list[str]:
    """Paths that COPY takes from the build context (not from another stage)."""
    sources: list[str] = []
    for instruction in instructions:
        if instruction.keyword != "COPY" or "--from=" in instruction.arguments:
            continue
        tokens = [token for token in shlex.split(instruction.arguments) if not token.startswith("--")]
        sources.extend(token.rstrip("/") for token in tokens[:-1])
    return sources


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """``*``, ``?`` and ``[...]`` stay inside one path segment; ``**`` spans any number of them."""
    tokens = re.split(r"(\*\*/|/\*\*|\*\*|\*|\?|\[[^\]]+\])", pattern.strip("/"))
    translation = {"**/": "(?:.*/)?", "/**": "(?:/.*)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}

    def translate(token: str) -> str:
        if token.startswith("[") and token.endswith("]") and len(token) > 2:
            return token  # a character class means the same in Go and in Python
        return translation.get(token, re.escape(token))

    return re.compile("".join(translate(token) for token in tokens))


def read_dockerignore(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_sent(rules: list[str], relative_path: str) -> bool:
    """Whether the build context includes ``relative_path`` under these .dockerignore rules."""
    prefixes = []
    segments = relative_path.strip("/").split("/")
    for end in range(1, len(segments) + 1):
        prefixes.append("/".join(segments[:end]))
    sent = True
    for rule in rules:
        is_exception = rule.startswith("!")
        regex = _pattern_regex(rule[1:] if is_exception else rule)
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            sent = is_exception
    return sent
