"""The port sidecar (board side): one utterance of the user's inputs in, the walked outputs out,
through any runner of a port engine (fp32, simulator, board, replay): the window walk
(rkstudy.walk.sidecar.WindowSidecar) or the stateful step (rkstudy.walk.stateful.StatefulWalker), whichever the
contract says.

Board side: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ...contract import Contract
from ...errors import EngineMismatch, UsageError
from ...walk.sidecar import WindowSidecar
from ...walk.stateful import StatefulWalker


class PortSidecar:
    """Checks the runner against the contract at init; decodes one utterance per call."""

    def __init__(self, runner, contract: Contract):
        self.contract = contract
        self.stateful = bool(contract.state)
        zeros = {t.name: np.zeros(t.shape, np.float32) for t in contract.role("constant")}
        self.walker = StatefulWalker(runner, contract, zeros) if self.stateful else WindowSidecar(runner, contract)

    def decode(self, utterance: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The walked outputs (batch axis dropped, frame axis last) of one utterance: its walked inputs
        and constants as the graph takes them (batch axis included)."""
        c = self.contract
        missing = [t.name for t in c.inputs if t.role in ("walked", "constant") and t.name not in utterance]
        if missing:
            raise EngineMismatch(f"the {c.family} engine needs {', '.join(missing)} as well")
        walked = {t.name: np.asarray(utterance[t.name], np.float32)[0] for t in c.role("walked")}
        constants = {t.name: np.asarray(utterance[t.name], np.float32) for t in c.role("constant")}
        if self.stateful:
            self.walker.set_constants(constants)
            return self.walker.decode(walked)
        t = c.role("walked")[0]
        return self.walker.run(walked[t.name].shape[-1] // t.rate, walked, constants, progress=False)

    @property
    def steps(self) -> int:
        return self.walker.steps if self.stateful else 0


def input_names(contract: Contract) -> list[str]:
    """The inputs a user's .npz brings: the walked ones and the constants (masks and state are the walker's)."""
    return [t.name for t in contract.inputs if t.role in ("walked", "constant")]


def load_inputs(path, names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """The utterances of an .npz of real inputs: key NAME for the first, NAME.1, NAME.2 ... for more,
    each array as the graph takes it (batch axis included). Every input in `names` must be there."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--inputs {path}: no such file; write one with numpy.savez(path, mel=..., ...)")
    with np.load(path) as data:
        arrays = {k: np.asarray(data[k], np.float32) for k in data.files}
    utterances: dict[int, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        name, dot, k = key.rpartition(".")
        name, k = (name, int(k)) if dot and k.isdigit() else (key, 0)
        if name not in names:
            raise UsageError(f"--inputs {path.name}: {key!r} names no input of the graph; "
                             f"its inputs: {', '.join(names)}")
        utterances.setdefault(k, {})[name] = value
    out = []
    for k in sorted(utterances):
        missing = [n for n in names if n not in utterances[k]]
        if missing:
            raise UsageError(f"--inputs {path.name}: utterance {k} has no {', '.join(missing)}")
        out.append(utterances[k])
    if not out:
        raise UsageError(f"--inputs {path.name} is empty; it needs {', '.join(names)}")
    return out
