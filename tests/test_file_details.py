"""Smaller file details (issue 20, item 12): workload texts keep what a line holds (JSON Lines end at \\n only,
CSV fields keep their characters), histograms of huge counts still draw, results follow the user's umask, log
names a Ray node sends stay plain names, and the recipe writes only shell variable names."""

import json
import os
import stat

import numpy as np
import pytest

from corescale.errors import UserError
from corescale.record.files import PendingRun, log_name, write_atomic
from corescale.tune.recipe import checked_env
from corescale.userfiles import read_text
from corescale.workload.samples import draw_lengths, read_texts

SEPARATORS = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\r"]  # str.splitlines() splits on each


@pytest.mark.parametrize("separator", SEPARATORS)
def test_jsonl_lines_end_at_newline_only(tmp_path, separator):
    text = f"a{separator}b"
    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n" + json.dumps({"text": "second"}) + "\n",
                    newline="")
    assert read_texts(f"{path}:text") == [text, "second"]


@pytest.mark.parametrize("separator", SEPARATORS[:-1])
def test_csv_fields_keep_their_characters(tmp_path, separator):
    path = tmp_path / "texts.csv"
    path.write_text(f'id,text\n1,"x{separator}y"\n2,"two\nlines"\n', newline="")
    assert read_texts(f"{path}:text") == [f"x{separator}y", "two\nlines"]


def test_text_lines_split_on_newline_and_lose_a_carriage_return(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("first\r\nsecond\u2028half\n\n", newline="")
    assert read_texts(str(path)) == ["first", "second\u2028half"]


@pytest.mark.parametrize("counts", [("1e308", "1e308"), ("1.7e308", "1e300"), ("1e-300", "1e-300")])
def test_histogram_counts_near_the_float_limits_still_draw(tmp_path, counts):
    path = tmp_path / "lengths.csv"
    path.write_text(f"8,{counts[0]}\n16,{counts[1]}\n")
    lengths = draw_lengths(str(path), np.random.default_rng(0), 1000, 32)
    assert set(lengths) <= {8, 16} and len(lengths) == 1000
    if counts[0] == counts[1]:
        assert 400 < int((lengths == 8).sum()) < 600


@pytest.mark.parametrize("limit, size, ok", [(100, 100, True), (100, 101, False), (0, 0, True)])
def test_read_text_stops_at_its_limit(tmp_path, limit, size, ok):
    path = tmp_path / "f.txt"
    path.write_text("x" * size)
    if ok:
        assert read_text(path, "file", limit) == "x" * size
    else:
        with pytest.raises(UserError, match="more than the 100 bytes corescale reads"):
            read_text(path, "file", limit)


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                        (0o002, 0o664, 0o775), (0o027, 0o640, 0o750)])
def test_results_are_as_readable_as_the_umask_allows(tmp_path, mask, file_mode, dir_mode):
    old = os.umask(mask)
    try:
        written = write_atomic(tmp_path / "report.html", "x")
        pending = PendingRun(tmp_path / "root", "run")
        final = pending.commit({"schema_version": 3})
    finally:
        os.umask(old)
    assert stat.S_IMODE(written.stat().st_mode) == file_mode
    assert stat.S_IMODE(final.stat().st_mode) == dir_mode
    assert stat.S_IMODE((final / "result.json").stat().st_mode) == file_mode


@pytest.mark.parametrize("name, plain", [
    ("instance-0.stderr.log", "instance-0.stderr.log"), ("../../etc/passwd", "_.._etc_passwd"),
    ("/abs/x", "_abs_x"), ("..", "log"), (".hidden", "hidden"), ("result.json", "log-result.json"),
    ("samples.parquet", "log-samples.parquet"), ("config.yaml", "log-config.yaml"), ("a\0b\nc", "a_b_c"),
    ("", "log"), (7, "7"),
])
def test_log_names_from_a_node_stay_plain_names(name, plain):
    assert log_name(name) == plain


@pytest.mark.parametrize("env", [{"A B": "1"}, {"A;rm -rf ~;B": "1"}, {"1ABC": "x"}, {"$(id)": "x"},
                                 {"OK": 5}, {"OK": None}, {5: "x"}, {"": "x"}, ["A=1"]])
def test_recipe_environment_names_are_shell_names(env):
    with pytest.raises(UserError, match="recipe is not written|not a mapping"):
        checked_env(env, "k")


def test_recipe_environment_of_shell_names_is_kept():
    env = {"OMP_NUM_THREADS": "2", "_X1": "a b; c", "LD_PRELOAD": "/x/libjemalloc.so"}
    assert checked_env(env, "k") == env
