"""What `agent-envs data list` prints reads as a table: a header naming the columns, and each
benchmark's description whole, wrapped at word boundaries under its column (never cut mid-word)."""

from __future__ import annotations

from agent_envs.cli import main
from agent_envs.data import BENCHMARKS


def test_data_list_has_a_header_and_whole_descriptions(tmp_path, capsys):
    assert main(["data", "list", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("id "))
    assert lines[header].split()[:4] == ["id", "here", "env", "id"] and "description" in lines[header]
    column = lines[header].index("description")
    rows = lines[header + 1:]
    for name, spec in BENCHMARKS.items():
        start = next(i for i, line in enumerate(rows) if line.startswith(f"{name} "))
        assert rows[start].split()[1] == "no" and rows[start].split()[2] == spec.env_id
        text = [rows[start][column:]]
        for line in rows[start + 1:]:
            if line[column:].startswith("source: "):
                break
            assert line[:column].strip() == "", line  # continued under the description column
            text.append(line[column:])
        assert " ".join(text) == " ".join(spec.description.split()), (name, text)
        assert all(len(line) <= 110 for line in text)
