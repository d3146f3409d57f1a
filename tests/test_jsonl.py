"""agentgym.jsonl.read_jsonl: the one reader of corpora, FlashRAG question files and problem files."""

from __future__ import annotations

import gzip

import pytest

from agentgym.envs.codeexec.problems import ProblemFormatError, load_problems
from agentgym.envs.services.retrieval import Corpus
from agentgym.envs.searchqa.data import DatasetFormatError, load_corpus_jsonl
from agentgym.jsonl import read_jsonl


class MyError(ValueError):
    pass


def test_rows_come_with_their_line_numbers_and_blank_lines_are_skipped(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n   \n{"b": "ü"}\n', encoding="utf-8")
    assert list(read_jsonl(p)) == [(1, {"a": 1}), (4, {"b": "ü"})]
    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write('{"a": 1}\n{"b": 2}\n')
    assert [obj for _, obj in read_jsonl(gz)] == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize("body, message", [
    (b'{"a": 1}\n{"a": \n', r"a\.jsonl:2: not valid JSON \(Expecting value at column 7\)"),
    (b'{"a": 1}\n[1, 2]\n', r"a\.jsonl:2: expected a JSON object, got list"),
    (b'"text"\n', r"a\.jsonl:1: expected a JSON object, got str"),
    (b'{"a": "\xff\xfe"}\n', r"a\.jsonl: cannot be read as UTF-8 jsonl"),
])
def test_a_bad_line_raises_the_callers_error_naming_file_and_line(tmp_path, body, message):
    p = tmp_path / "a.jsonl"
    p.write_bytes(body)
    with pytest.raises(MyError, match=message):
        list(read_jsonl(p, error=MyError))


def test_a_gz_name_on_a_plain_file_is_a_short_error(tmp_path):
    p = tmp_path / "a.jsonl.gz"
    p.write_text('{"a": 1}\n')
    with pytest.raises(MyError, match="cannot be read as UTF-8 jsonl"):
        list(read_jsonl(p, error=MyError))


def test_missing_file_and_folder_say_which(tmp_path):
    with pytest.raises(FileNotFoundError, match="corpus file not found: .*nope.jsonl"):
        list(read_jsonl(tmp_path / "nope.jsonl", what="corpus"))
    with pytest.raises(FileNotFoundError, match="is a directory, not a .jsonl file"):
        list(read_jsonl(tmp_path, what="corpus"))


def test_every_loader_gives_the_same_line_error_with_its_own_class(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('\n[1]\n')
    with pytest.raises(DatasetFormatError, match=r"x\.jsonl:2: expected a JSON object"):
        load_corpus_jsonl(p)
    with pytest.raises(ValueError, match=r"x\.jsonl:2: expected a JSON object"):
        Corpus.from_jsonl(p)
    with pytest.raises(ProblemFormatError, match=r"x\.jsonl:2: expected a JSON object"):
        load_problems(p, fmt="humaneval")
