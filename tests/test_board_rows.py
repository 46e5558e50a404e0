"""What a board row records about who wrote it: results handed back to the user who ran sudo (or a
refusal before the decode when an earlier sudo run left them root-owned), and the commit read even
from a clone git calls of dubious ownership, or the reason there is none."""

import os
import subprocess

import pytest

from rkstudy.board import run
from rkstudy.errors import InputError
from rkstudy.tables import results

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@ROOT_ONLY
def test_under_sudo_what_a_run_wrote_goes_back_to_the_invoking_user(tmp_path, monkeypatch):
    monkeypatch.setenv("SUDO_UID", "4321")
    monkeypatch.setenv("SUDO_GID", "4322")
    table = tmp_path / "results" / "board" / "piper_decoder.csv"
    missing, existing = run._missing_dirs(table)
    assert missing == [tmp_path / "results" / "board", tmp_path / "results"] and existing == tmp_path
    run.append_row("board", "piper_decoder", results.stamp({"rtf": 0.1, "where": "replay", "target": "rk3588"}),
                   tmp_path / "results")
    run.hand_back([table, table.with_suffix(".md")], missing)
    for path in (table, table.with_suffix(".md"), *missing):
        assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4322), path
    assert tmp_path.stat().st_uid == 0  # a folder it did not make stays as it was


def test_without_sudo_nothing_changes_hands(tmp_path, monkeypatch):
    monkeypatch.delenv("SUDO_UID", raising=False)
    path = tmp_path / "x.csv"
    path.write_text("a\n")
    before = path.stat().st_uid
    run.hand_back([path], [])
    assert path.stat().st_uid == before and run.invoking_user() is None


def test_outputs_this_user_cannot_write_are_refused_before_the_decode(tmp_path, monkeypatch):
    table = tmp_path / "board" / "piper_decoder.csv"
    table.parent.mkdir()
    table.write_text("rtf\n0.1\n")
    run.require_writable([table, tmp_path / "new" / "out.wav"])  # writable: no refusal
    monkeypatch.setattr(run.os, "access", lambda path, mode: str(path) != str(table))
    with pytest.raises(InputError, match=r"piper_decoder.csv is not writable by this user \(owned by .*earlier run "
                                         r"under sudo\): sudo chown -R \$USER .*piper_decoder.csv, or pass --results"):
        run.require_writable([table])


@ROOT_ONLY
def test_the_commit_is_read_from_a_clone_git_calls_of_dubious_ownership(tmp_path, monkeypatch):
    repo = tmp_path / "clone"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (repo / "f").write_text("x\n")
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    head = subprocess.run(git[:3] + ["rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout
    subprocess.run(["chown", "-R", "4321:4321", str(repo)], check=True)
    refused = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "SUDO_UID"})
    assert refused.returncode != 0 and "dubious ownership" in refused.stderr  # what plain git does
    monkeypatch.setattr(results, "REPO", repo)
    results.commit.cache_clear()
    try:
        assert results.commit() == head.strip()
    finally:
        results.commit.cache_clear()


def test_a_row_says_why_it_has_no_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "REPO", tmp_path)
    results.commit.cache_clear()
    try:
        assert results.commit().startswith("unknown (not a git repository")
    finally:
        results.commit.cache_clear()
