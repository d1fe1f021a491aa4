"""The parts of docs/reference.md that are generated from the code, so they
cannot drift from it: the command table from the click commands themselves,
the environment table from the settings model, the metrics table from
shared/observability/metrics.py.

`make docs` (``python -m tests.support.reference_docs``) rewrites the blocks
between their BEGIN/END markers; tests/deploy/test_reference.py fails while
the file differs from what this module renders.
"""

import re
import sys
from pathlib import Path

import click
from prometheus_client.metrics import MetricWrapperBase

from webhook_ingest.cli.main import main as cli
from webhook_ingest.shared.observability import metrics
from webhook_ingest.shared.settings import ENVIRONMENT_VARIABLES, Settings

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
_BLOCK = re.compile(r"(<!-- BEGIN GENERATED (\w+)[^\n]*-->\n)(.*?)(<!-- END GENERATED \2 -->)", re.DOTALL)


def cell(text: object) -> str:
    """Text fit for one markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def commands(group: click.Group = cli, prefix: str = "webhook-ingest") -> list[tuple[str, click.Command]]:
    """Every runnable command, depth first, in alphabetical order."""
    found = []
    context = click.Context(group, info_name=prefix)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            found.extend(commands(command, path))
        else:
            found.append((path, command))
    return found


def metavar(parameter: click.Parameter) -> str:
    if isinstance(parameter.type, click.Choice):
        return "|".join(map(str, parameter.type.choices))
    if isinstance(parameter, click.Argument):
        return parameter.metavar or (parameter.name or "").upper()
    return {"integer": "N", "float": "SECONDS", "integer range": "N"}.get(parameter.type.name, "TEXT")


def synopsis(path: str, command: click.Command) -> str:
    words = [path]
    for parameter in command.params:
        if isinstance(parameter, click.Argument):
            words.append(metavar(parameter))
        elif isinstance(parameter, click.Option) and not parameter.hidden:
            option = max(parameter.opts, key=len)
            words.append(f"[{option}]" if parameter.is_flag else f"[{option} {metavar(parameter)}]")
    return " ".join(words)


def default(parameter: click.Parameter) -> str:
    value = parameter.default
    if isinstance(parameter, click.Option) and parameter.is_flag:
        return "off"
    if value is None or value == ():
        return "—"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def render_commands() -> str:
    lines = ["| command | does |", "| --- | --- |"]
    for path, command in commands():
        lines.append(f"| `{cell(synopsis(path, command))}` | {cell(command.get_short_help_str(limit=200))} |")
    lines += ["", "| command | option | default | what |", "| --- | --- | --- | --- |"]
    for path, command in commands():
        for parameter in command.params:
            if isinstance(parameter, click.Option) and not parameter.hidden:
                option = cell(", ".join(parameter.opts))
                lines.append(f"| `{path}` | `{option}` | {cell(default(parameter))} | {cell(parameter.help or '')} |")
    return "\n".join(lines) + "\n"


def setting_default(value: object) -> str:
    if value is None or value == "":
        return "unset"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def render_environment() -> str:
    meanings = dict(ENVIRONMENT_VARIABLES)
    lines = ["| variable | default | what |", "| --- | --- | --- |"]
    for field in Settings.model_fields.values():
        name = field.alias
        lines.append(f"| `{name}` | {cell(setting_default(field.default))} | {cell(meanings.get(name, ''))} |")
    return "\n".join(lines) + "\n"


def render_metrics() -> str:
    lines = ["| metric | type | labels | what |", "| --- | --- | --- | --- |"]
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            name = metric._name + ("_total" if metric._type == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in metric._labelnames)
            lines.append(f"| `{name}` | {metric._type} | {labels} | {cell(metric._documentation)} |")
    return "\n".join(lines) + "\n"


RENDERERS = {"commands": render_commands, "environment": render_environment, "metrics": render_metrics}


def rewrite(text: str) -> str:
    """`text` with every generated block rendered afresh from the code."""
    return _BLOCK.sub(lambda match: match[1] + RENDERERS[match[2]]() + match[4], text)


def main() -> None:
    text = REFERENCE.read_text()
    fresh = rewrite(text)
    if fresh != text:
        REFERENCE.write_text(fresh)
        print(f"rewrote the generated blocks of {REFERENCE.name}")
    else:
        print(f"{REFERENCE.name} is up to date")
    sys.exit(0)


if __name__ == "__main__":
    main()
