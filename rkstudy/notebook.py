"""What every study notebook does the same way, once (host): show a table, show the seeds' figures
beside ours, stamp and write tables, save figures as PNG for readers on a code host, play short
audio clips, and record the headline numbers the notebook tests and the results index read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from . import cache, claims, gates, results
from .paths import results_root

CLIP_SECONDS = 5.0  # audio embedded in an executed notebook; the full render goes to the cache


def _with_risk(row: Mapping) -> dict:
    """An engine row (one with a REGTASK count) with its board-risk verdict, read from the whole row:
    a simulator SNR is never written without what the compiler logged beside it."""
    row = dict(row)
    if "regtask" in row:
        row["board_risk"] = gates.board_risk(row)
    return row


class Study:
    """One notebook's study: `Study("piper_decoder", QUICK)`."""

    def __init__(self, study: str, quick: bool):
        self.study, self.quick = study, quick
        self.root = results_root(quick)
        self.tables: dict[str, tuple[list[dict], str]] = {}
        self.headline_values: dict[str, dict] = {}

    def __repr__(self) -> str:
        return f"Study({self.study!r}, {'quick' if self.quick else 'full'} mode, tables -> {self.root / self.study})"

    # --- showing ---------------------------------------------------------------------------
    @staticmethod
    def show(rows: Iterable[Mapping], columns: list[str] | None = None) -> None:
        from IPython.display import Markdown, display

        rows = [dict(r) for r in rows]
        if not rows:
            print("(no rows)")
            return
        display(Markdown(results.to_markdown(rows, columns or [c for c in rows[0] if c not in results.STAMP[:3]])))

    def seeds(self, *words: str, study: str | None = None) -> list[dict]:
        """Show the seeds' figures for this study whose text contains any of `words` (all of them
        with no words): theirs, not ours, from data/reference/seeds.csv."""
        rows = [r for r in results.reference(study or self.study)
                if not words or any(w.lower() in r["figure"].lower() for w in words)]
        self.show(rows, ["figure", "value", "unit", "where", "target", "section"])
        return rows

    # --- tables, figures, audio, headlines -------------------------------------------------------
    def table(self, name: str, rows: Iterable[Mapping], title: str, by=None,
              show: list[str] | bool = True) -> list[dict]:
        """Stamp `rows` (where/target from `by` or from each row) and keep them for write_tables();
        show them (the given columns, or all) unless `show=False`. A row with a REGTASK count gets
        its `board_risk` verdict (rkstudy.gates.board_risk) from everything else in the row."""
        stamped = [results.stamp(_with_risk(r), by) for r in rows]
        self.tables[name] = (stamped, title)
        if show:
            self.show(stamped, show if isinstance(show, list) else None)
        return stamped

    def write_tables(self) -> list[Path]:
        return [results.write_table(self.study, name, rows, root=self.root, title=title)
                for name, (rows, title) in self.tables.items()]

    def figure(self, fig, name: str) -> Path:
        """Save `fig` as results/<study>/figures/<name>.png (the notebook still shows it inline)."""
        return results.save_figure(fig, self.study, name, root=self.root)

    def listen(self, pcm: np.ndarray, sample_rate: int, name: str):
        """The full render to the cache as WAV; an audio player of its first CLIP_SECONDS."""
        from IPython.display import Audio, display

        from .board.run import write_wav

        pcm = np.asarray(pcm, np.float32).ravel()
        write_wav(cache.cache_dir("audio") / f"{self.study}_{name}.wav", pcm, sample_rate)
        clip = pcm[: int(CLIP_SECONDS * sample_rate)]
        print(f"{name}: {pcm.size / sample_rate:.1f} s (player: first {clip.size / sample_rate:.1f} s)")
        display(Audio(clip, rate=sample_rate))

    def headline(self, name: str, value, unit: str = "", seeds: str = "", comparable: str = "") -> None:
        """Record one headline number, with the reference figure it is shown beside (by its exact
        text) and whether the two are the same quantity under the same conditions: `"same"` or
        `"differs: <what>"` (rkstudy.results.record_headlines refuses a figure without it)."""
        self.headline_values[name] = {"value": value, "unit": unit, "seeds": seeds, "comparable": comparable}

    def reference_claims(self) -> list[dict]:
        """Record `reference_claims`: each of the reference documents' measured claims for this
        study (data/reference/claims.csv) beside ours, read from the tables this notebook recorded
        in this run, with its verdict. Call it after the last table, before finish()."""
        rows = claims.evaluate(self.study, {n: t for n, (t, _) in self.tables.items() if n != "reference_claims"},
                               self.quick)
        if not rows:
            print(f"the reference documents make no measured claim about {self.study}")
            return []
        tally = claims.counts([r["verdict"] for r in rows])
        print(", ".join(f"{n} {kind}" for kind, n in tally.items()))
        return self.table("reference_claims", rows, "The reference documents' measured claims beside ours",
                          by=results.HOST, show=["claim", "theirs", "ours", "verdict"])

    def finish(self) -> None:
        """Write every table and the headlines; print where they went."""
        for path in self.write_tables():
            print(path)
        if self.headline_values:
            print(results.record_headlines(self.study, self.headline_values, root=self.root))
