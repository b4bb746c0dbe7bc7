"""Episodes that span rows, one row per turn (docs/episodes.md): what each turn row adds to the
keyed-statistics pass (:class:`TurnRows`: its episode, turn index, turn reward and outcome,
its group, state and step ids, and where it sits), merged over every input in input order;
the checks of an episode's rows over every input (:meth:`TurnRows.settle`: a turn index
twice, outcomes or groups that disagree, a row rejected), and the turn-row estimators' row
advantages (gigpo, step-reinforce: :func:`turn_row_advantages`), computed once over the merged
rows and handed to each file's unit for its own rows."""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

import numba
import numpy as np
import pyarrow as pa

from gaecli.advantages.keyed import KeyTable

CODED = ("episode", "group", "state", "step")
"""The ids of a turn row, each coded by a :class:`KeyTable` of its own (−1: not read)."""

NUMBERS = {
    "turn": np.int64,
    "reward": np.float64,
    "outcome": np.float64,
    "row": np.int64,
    "part": np.int64,
    "tokens": np.int64,
    "first_value": np.float64,
    "first_advantage": np.float64,
    "score_part": np.float64,
}
"""The numbers of a turn row: its turn index, its turn's reward, the episode's outcome as the
row gives it, its row in its file and the part (file, in input order) it came from; for masked
GAE over episodes its carry figures (:func:`carry_figures`: trainable tokens, the value and the
advantage at its first trainable token; 0 where not computed), and for the outcome estimators
its part of its episode's score (its trainable tokens' rewards, added in token order)."""

READ_NUMBERS = ("turn", "reward", "outcome", "row", "tokens", "first_value", "first_advantage", "score_part")
"""The numbers a batch gives (the part is numbered on merge)."""

INVALID = {"invalid_episode": np.int64, "invalid_row": np.int64, "invalid_part": np.int64}
"""Rows the checks rejected, by episode: their whole episode is rejected with them."""


class EpisodeFault(NamedTuple):
    """A fault of an episode's rows found over every input: where (``part``: the input, in
    input order; ``row``: in it), the column's role (``turn``, ``outcome``, ``group``, or
    ``row`` for a row the checks rejected), the rule ``code`` and the message."""

    part: int
    row: int
    role: str
    code: str
    message: str


@numba.njit(cache=True, nogil=True)
def _discounted_in_order(episodes, rewards, gamma, out):
    # rows sorted by (episode, turn): R = r + γ·R over each episode, backwards
    running = 0.0
    for i in range(episodes.shape[0] - 1, -1, -1):
        if i == episodes.shape[0] - 1 or episodes[i] != episodes[i + 1]:
            running = 0.0
        running = rewards[i] + gamma * running
        out[i] = running


def discounted_turn_returns(episodes: np.ndarray, turns: np.ndarray, rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Each turn row's discounted return (float64 ``[B]``): its turn's reward plus γ times the
    return of the next turn of its episode (by turn index; gaps in the indices are not turns),
    ROLL's ``compute_discounted_returns``. ``episodes`` int codes, ``turns`` ints, ``rewards``
    float64, one per row."""
    order = np.lexsort((turns, episodes))
    ordered = np.empty(order.size, dtype=np.float64)
    _discounted_in_order(
        np.ascontiguousarray(episodes[order]), np.ascontiguousarray(rewards[order], dtype=np.float64),
        float(gamma), ordered,
    )  # fmt: skip
    returns = np.empty_like(ordered)
    returns[order] = ordered
    return returns


def normalised_in_groups(values: np.ndarray, groups: np.ndarray, steps: Optional[np.ndarray], rule) -> np.ndarray:
    """``values`` (float64 ``[B]``, one per turn row) normalised by ``rule``
    (:func:`gaecli.advantages.normalization.rule_center_scale`) within the rows of equal
    ``groups`` code (the group level) and of equal ``steps`` code (the batch level; None: the
    whole input), each row counted once; the statistics are compensated sums added in row
    order (:class:`gaecli.advantages.statistics.Scores`)."""
    from gaecli.advantages.normalization import rule_center_scale
    from gaecli.advantages.statistics import Scores, score_figures

    rows = values.size
    figures = score_figures(values, np.zeros(rows, dtype=np.int64))
    by_group = Scores()
    keys = pa.array(groups, type=pa.int64())
    by_group.add(keys, figures)
    codes = by_group.known_codes(keys, rows, "group")
    group = tuple(column[codes] for column in by_group.moments())
    batch = None
    if "batch" in rule.levels_used():
        by_step = Scores()
        step_keys = None if steps is None else pa.array(steps, type=pa.int64())
        by_step.add(step_keys, figures)
        step_codes = by_step.known_codes(step_keys, rows, "step") if steps is not None else np.zeros(rows, np.int64)
        batch = tuple(column[step_codes] for column in by_step.moments())
    with np.errstate(divide="ignore", invalid="ignore"):
        centers, scales = rule_center_scale(rule, *group, np, batch=batch, values=values)
        return (values - centers) / scales


def turn_row_advantages(spec, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each turn row's advantage (float64 ``[B]``) under ``spec`` (gigpo or step-reinforce;
    docs/episodes.md) from the rows' ``episode``, ``group``, ``state`` and ``step`` codes (int,
    −1 where not read), ``turn`` indices, turn ``reward`` and ``outcome``. The step return is
    :func:`discounted_turn_returns` with ``spec.gamma``; the rule is ``spec.whitening_rule`` or
    ROLL's (:data:`gaecli.advantages.normalization.TURN_ROW_RULE`). step-reinforce: the return
    normalised within the group; gigpo: ``episode_weight`` × the outcome normalised within the
    group + ``step_weight`` × the return normalised within the state group (the rows of one
    group with one state id: state groups never span groups)."""
    from gaecli.advantages.normalization import TURN_ROW_RULE

    rule = spec.whitening_rule or TURN_ROW_RULE
    steps = rows["step"] if spec.step_by is not None else None
    returns = discounted_turn_returns(rows["episode"], rows["turn"], rows["reward"], spec.gamma)
    if spec.estimator == "step-reinforce":
        return normalised_in_groups(returns, rows["group"], steps, rule)
    states = rows["state"]
    state_groups = rows["group"] * (int(states.max(initial=-1)) + 1) + states  # (group, state) as one code
    episode_part = normalised_in_groups(rows["outcome"].astype(np.float64), rows["group"], steps, rule)
    step_part = normalised_in_groups(returns, state_groups, steps, rule)
    episode_weight = 1.0 if spec.episode_weight is None else float(spec.episode_weight)
    step_weight = 1.0 if spec.step_weight is None else float(spec.step_weight)
    return episode_weight * episode_part + step_weight * step_part


def carry_figures(advantages: np.ndarray, values, trainable: np.ndarray, offsets: np.ndarray) -> dict:
    """What masked GAE over episodes needs of each row (flat ``[N]`` advantages of the row on
    its own, its turn reward as its only terminal reward; values; bool trainable; offsets
    ``[B + 1]``): its trainable ``tokens`` K and the value (``values`` None: 0) and advantage at
    its first trainable token (0 for K = 0), ``[B]`` each. The row's GAE is affine in the carry ``X`` that enters
    it after its last trainable token: its first advantage is ``a₀ + (γλ)^(K−1)·X``."""
    positions = np.flatnonzero(trainable)
    starts = np.searchsorted(positions, offsets[:-1])
    tokens = (np.searchsorted(positions, offsets[1:]) - starts).astype(np.int64)
    first = positions[np.minimum(starts, max(positions.size - 1, 0))] if positions.size else starts
    has = tokens > 0
    read = positions.size and values is not None  # a critic-free estimator's values are 0
    return {
        "tokens": tokens,
        "first_value": np.where(has, values[first] if read else 0.0, 0.0).astype(np.float64),
        "first_advantage": np.where(has, advantages[first] if positions.size else 0.0, 0.0).astype(np.float64),
    }


@numba.njit(cache=True, nogil=True)
def _carries_in_order(episodes, tokens, first_value, first_advantage, outcome, gamma, decay, out):
    # rows sorted by (episode, turn), backwards: the carry entering a row after its last
    # trainable token is the outcome for the episode's last row with a trainable token, else
    # γ·V + γλ·A at the next such row's first trainable token, A = a₀ + (γλ)^(K−1)·X
    have_next = False
    next_value = next_advantage = next_carry = 0.0
    next_tokens = 0
    for i in range(episodes.shape[0] - 1, -1, -1):
        if i == episodes.shape[0] - 1 or episodes[i] != episodes[i + 1]:
            have_next = False
        if tokens[i] == 0:
            out[i] = 0.0  # a fully masked row: no token reads it
            continue
        if have_next:
            carry = gamma * next_value + decay * (next_advantage + decay ** (next_tokens - 1) * next_carry)
        else:
            carry = outcome[i]
        out[i] = carry
        have_next = True
        next_value, next_advantage, next_tokens, next_carry = first_value[i], first_advantage[i], tokens[i], carry


def episode_terminals(spec, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """Masked GAE over episodes (docs/episodes.md): each row's terminal reward for the kernel
    (float64 ``[B]``), its turn reward plus the carry entering it from the later rows of its
    episode (in turn order): the outcome for the episode's last row with a trainable token,
    ``γ·V_next + γλ·A_next`` at the next such row's first trainable token otherwise, so that
    the row's own masked GAE with it is the episode's over its trainable subsequence."""
    order = np.lexsort((rows["turn"], rows["episode"]))
    carries = np.empty(order.size, dtype=np.float64)
    arrays = [np.ascontiguousarray(rows[name][order]) for name in ("episode", "tokens", "first_value",
                                                                    "first_advantage", "outcome")]  # fmt: skip
    lambd = 1.0 if spec.lambd is None else float(spec.lambd)  # reinforce++: λ = 1
    _carries_in_order(*arrays, float(spec.gamma), float(spec.gamma) * lambd, carries)
    terminals = np.empty_like(carries)
    terminals[order] = carries
    return rows["reward"] + terminals


def settled_values(spec, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """What ``spec`` settles per turn row once every row is merged (float64 ``[B]``): the
    terminal reward each row is then computed with (:data:`gaecli.advantages.contract.CARRIED`), a turn-row estimator's
    advantage (:func:`turn_row_advantages`), or an outcome estimator's episode advantage
    (:func:`episode_advantages`)."""
    from gaecli.advantages.contract import CARRIED, TURN_ROW_ESTIMATORS

    if spec.estimator in CARRIED:
        return episode_terminals(spec, rows)
    if spec.estimator in TURN_ROW_ESTIMATORS:
        return turn_row_advantages(spec, rows)
    return episode_advantages(spec, rows)


def episode_advantages(spec, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """An outcome estimator over episodes (docs/episodes.md): each episode's score, its outcome
    plus its rows' score parts in turn order, is the estimator's score of one unit of its group
    (each episode once: the group and step statistics over episodes, with the trainable tokens
    of all its rows); each row gets its episode's advantage (float64 ``[B]``)."""
    from gaecli.advantages.estimators import row_needs, statistics_row_advantages
    from gaecli.advantages.statistics import KeyedStatistics, score_figures

    order = np.lexsort((rows["turn"], rows["episode"]))
    ordered = rows["episode"][order]
    new = np.concatenate([[True], ordered[1:] != ordered[:-1]]) if order.size else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new)
    episode_of = np.empty(order.size, dtype=np.int64)
    episode_of[order] = np.cumsum(new) - 1
    first = order[starts]
    parts = np.add.reduceat(rows["score_part"][order], starts) if order.size else np.zeros(0)
    scores = rows["outcome"][first] + parts
    tokens = np.add.reduceat(rows["tokens"][order], starts) if order.size else np.zeros(0, dtype=np.int64)
    per_row = row_spec(spec)
    keyed = {spec.group_by: rows["group"][first], spec.step_by: rows["step"][first]}
    keys = {name: pa.array(codes, type=pa.int64()) for name, codes in keyed.items() if name is not None}
    needs = [need for need in row_needs(per_row) if need.of == "scores"]  # the sides' whitening comes later
    statistics = KeyedStatistics(tuple(statistic for need in needs for statistic in need.statistics(per_row, "new")))
    for statistic in statistics.statistics:
        statistics[statistic].add(None if statistic.key is None else keys[statistic.key], score_figures(scores, tokens))
    group_keys, step_keys = keys.get(spec.group_by), keys.get(spec.step_by)
    return statistics_row_advantages(statistics, per_row, scores, group_keys, step_keys)[episode_of]


def turn_row_figures(operand: Mapping, trainable: np.ndarray, offsets: np.ndarray) -> Mapping:
    """What a batch's turn rows add to :class:`TurnRows` (the ``turns`` operand, made by the
    data path per batch, as it is)."""
    return operand


class TurnRows:
    """The turn rows of some inputs (the statistic ``turn-rows`` keyed by the episode column):
    per row its ids coded (:data:`CODED`, one :class:`KeyTable` each, in first-seen order) and
    its numbers (:data:`NUMBERS`), in row order, then other parts' rows in input order
    (:meth:`merge`), and the rows the checks rejected with their episodes. :meth:`settle`
    checks the episodes and computes each turn-row side's advantages over every row at once;
    :meth:`subset` keeps one part's rows, :meth:`take_settled` gives them their results.
    About 60 bytes a row; picklable."""

    def __init__(self) -> None:
        self.table = None  # the statistics' protocol: no key table to share
        self.tables = {name: KeyTable() for name in CODED}
        self.columns = {name: np.zeros(0, dtype=np.int64) for name in CODED}
        self.columns.update({name: np.zeros(0, dtype=dtype) for name, dtype in NUMBERS.items()})
        self.invalid = {name: np.zeros(0, dtype=dtype) for name, dtype in INVALID.items()}
        self.parts = 0
        self.index: Optional[np.ndarray] = None  # a subset's rows in the merged rows
        self.results: dict = {}
        self.rejected: Optional[np.ndarray] = None
        self.reasons: dict[int, str] = {}
        self._pending: list = []
        self._count = 0

    @property
    def rows(self) -> int:
        """The turn rows held."""
        return self._count

    def _append(self, columns: Mapping[str, np.ndarray], invalid: Mapping[str, np.ndarray]) -> None:
        self._pending.append((columns, invalid))  # joined once, when read (:meth:`_joined`)
        self._count += len(columns["turn"])

    def _joined(self) -> None:
        if not self._pending:
            return
        for store in ("columns", "invalid"):
            held = getattr(self, store)
            for name in held:
                pieces = [held[name], *(part[store == "invalid"].get(name) for part in self._pending)]
                held[name] = np.concatenate([piece for piece in pieces if piece is not None])
        self._pending = []

    def __getstate__(self) -> dict:
        self._joined()
        return dict(self.__dict__)

    def _encode(self, name: str, keys: Optional[pa.Array], rows: int) -> np.ndarray:
        if keys is None:
            return np.full(rows, -1, dtype=np.int64)
        return self.tables[name].encode(keys)

    def add(self, keys: pa.Array, rows: Mapping) -> None:
        """Add one batch's valid turn rows in row order: their episode ``keys`` and ``rows``
        (:func:`turn_row_figures`: ``turn``, ``reward``, ``outcome``, ``row`` numbers; the
        ``group``, ``state`` and ``step`` ids as Arrow arrays or None), and the batch's rejected
        rows (``invalid_keys``, their episode ids, a null where the id is null;
        ``invalid_rows``)."""
        count = len(keys)
        columns = {"episode": self._encode("episode", keys, count)}
        for name in CODED[1:]:
            columns[name] = self._encode(name, rows.get(name), count)
        for name in READ_NUMBERS:
            given = rows.get(name)
            columns[name] = np.zeros(count, NUMBERS[name]) if given is None else np.asarray(given, NUMBERS[name])
        columns["part"] = np.zeros(count, dtype=np.int64)
        invalid_keys, invalid_rows = rows.get("invalid_keys"), rows.get("invalid_rows")
        invalid = {}
        if invalid_keys is not None and len(invalid_keys):
            named = np.asarray(invalid_keys.is_valid())
            invalid = {
                "invalid_episode": self.tables["episode"].encode(invalid_keys.filter(pa.array(named))),
                "invalid_row": np.asarray(invalid_rows, dtype=np.int64)[named],
                "invalid_part": np.zeros(int(named.sum()), dtype=np.int64),
            }
        self._append(columns, invalid)

    def merge(self, other: "TurnRows") -> np.ndarray:
        """Add another part's rows after ours (its ids recoded here, its part numbered next);
        returns where its rows are here."""
        other._joined()
        start = self.rows
        columns = {}
        for name in CODED:
            codes = other.columns[name]
            if other.tables[name].size:
                mapping = self.tables[name].encode(other.tables[name].keys())
                codes = np.where(codes >= 0, mapping[np.maximum(codes, 0)], -1)
            columns[name] = codes
        for name in READ_NUMBERS:
            columns[name] = other.columns[name]
        columns["part"] = np.full(other.rows, self.parts, dtype=np.int64)
        invalid = {"invalid_row": other.invalid["invalid_row"]}
        episodes = other.invalid["invalid_episode"]
        if episodes.size:
            episodes = self.tables["episode"].encode(other.tables["episode"].keys())[episodes]
        invalid["invalid_episode"] = episodes
        invalid["invalid_part"] = np.full(episodes.size, self.parts, dtype=np.int64)
        self._append(columns, invalid)
        self.parts += 1
        return np.arange(start, self.rows, dtype=np.int64)

    def subset(self, codes: np.ndarray, table=None) -> "TurnRows":
        """The rows ``codes`` (as :meth:`merge` returned them) alone: their rows in their file
        (what their unit looks its results up by), their results once settled."""
        self._joined()
        part = TurnRows()
        part.columns["row"] = self.columns["row"][codes]
        part.index = codes
        part._count = codes.size
        return part

    def settle(self, specs, labels) -> list[EpisodeFault]:
        """Check the episodes over every row and compute each of ``specs`` (the turn-row sides:
        each row's advantage; masked GAE over episodes: each row's terminal reward,
        :func:`episode_terminals`) over the rows of the episodes kept (``labels``: each part's
        name in the messages, in input order). Returns the faults found (one per episode at fault, the earliest in
        input order first): a caller that stops on invalid data raises the first; otherwise
        every row of an episode at fault is rejected (:attr:`rejected`, :attr:`reasons`) and
        left out of every statistic."""
        self._labels = list(labels)
        self._joined()
        faults = self._faults()
        bad = np.zeros(self.tables["episode"].size, dtype=bool)
        first_reason: dict[int, str] = {}
        for episode, fault in faults:
            bad[episode] = True
            first_reason.setdefault(episode, fault.message)
        self.rejected = bad[self.columns["episode"]] if self.rows else np.zeros(0, dtype=bool)
        self.reasons = {
            int(index): f"rejected with its episode ({first_reason[int(self.columns['episode'][index])]})"
            for index in np.flatnonzero(self.rejected).tolist()
        }
        kept = ~self.rejected
        rows = {name: values[kept] for name, values in self.columns.items()}
        for spec in specs:
            values = np.full(self.rows, np.nan)
            values[kept] = settled_values(spec, rows)
            self.results[spec] = values
        return [fault for _, fault in faults]

    def _faults(self) -> list[tuple[int, EpisodeFault]]:
        """(episode code, fault) of each episode at fault, by the fault's place in input order."""
        episodes, turns = self.columns["episode"], self.columns["turn"]
        order = np.lexsort((turns, episodes))
        ordered = episodes[order]
        same = ordered[1:] == ordered[:-1]
        keys = self.tables["episode"].keys()
        found: list[tuple[tuple[int, int], int, EpisodeFault]] = []

        def add(earlier: np.ndarray, later: np.ndarray, role: str, code: str, what) -> None:
            for a, b in zip(earlier.tolist(), later.tolist()):
                part, row = int(self.columns["part"][b]), int(self.columns["row"][b])
                episode = int(episodes[b])
                message = f"episode {keys[episode].as_py()!r}: " + what(a, b)
                found.append(((part, row), episode, EpisodeFault(part, row, role, code, message)))

        twice = np.flatnonzero(same & (turns[order][1:] == turns[order][:-1]))
        earlier, later = np.minimum(order[twice], order[twice + 1]), np.maximum(order[twice], order[twice + 1])
        add(earlier, later, "turn", "duplicate-turn", lambda a, b: f"turn {turns[b]} is also the turn of {self._at(a)}")
        earliest = np.full(self.tables["episode"].size, self.rows, dtype=np.int64)
        np.minimum.at(earliest, episodes, np.arange(self.rows, dtype=np.int64))  # each episode's first row
        for role in ("outcome", "group", "step"):
            values = self.columns[role]
            differ = np.flatnonzero(values != values[earliest[episodes]])
            add(earliest[episodes[differ]], differ, role, "episode-mismatch", self._disagreement(role))
        invalid = self.invalid
        for episode, row, part in zip(*(invalid[name].tolist() for name in INVALID)):
            message = f"episode {keys[episode].as_py()!r}: its turn at {self._labels[part]} row {row} is invalid"
            found.append(((part, row), episode, EpisodeFault(part, row, "row", "episode-rejected", message)))
        found.sort(key=lambda item: item[0])
        return [(episode, fault) for _, episode, fault in found]

    def _at(self, index: int) -> str:
        return f"{self._labels[int(self.columns['part'][index])]} row {int(self.columns['row'][index])}"

    def _disagreement(self, role: str):
        if role == "outcome":
            outcomes = self.columns["outcome"]
            return lambda a, b: (
                f"its outcome {outcomes[b].item()!r} disagrees with {outcomes[a].item()!r} at {self._at(a)} "
                "(the terminal reward is the episode's outcome, the same on every turn row)"
            )
        keys = self.tables[role].keys()
        codes = self.columns[role]
        return lambda a, b: (
            f"its {role} {keys[int(codes[b])].as_py()!r} disagrees with {keys[int(codes[a])].as_py()!r} "
            f"at {self._at(a)} (an episode's rows are one member of one {role})"
        )

    def take_settled(self, merged: "TurnRows") -> None:
        """This subset's results, rejections and reasons out of the settled ``merged`` rows."""
        self.results = {spec: values[self.index] for spec, values in merged.results.items()}
        self.rejected = merged.rejected[self.index]
        places = np.flatnonzero(self.rejected)
        self.reasons = {place: merged.reasons[int(self.index[place])] for place in places.tolist()}

    def places(self, file_rows: np.ndarray) -> np.ndarray:
        """Where rows of the file (``file_rows``) are among these rows (each must be here)."""
        self._joined()
        places = np.searchsorted(self.columns["row"], file_rows)
        if places.size and (
            places.max() >= self.columns["row"].size or (self.columns["row"][places] != file_rows).any()
        ):
            raise ValueError("turn rows: a row was not in the statistics pass")
        return places

    def settled(self, spec, file_rows: np.ndarray) -> np.ndarray:
        """The settled value of ``spec`` at each of ``file_rows`` (float64): a turn-row
        estimator's advantage, masked GAE's terminal reward over episodes."""
        return self.results[spec][self.places(file_rows)]



def batch_turn_row_advantages(
    spec, outcomes: np.ndarray, ids: Mapping, turns: np.ndarray, rewards: np.ndarray, carries: Optional[dict] = None
):
    """The settled value of each turn row of one batch that is the whole input (the Python
    API), float64 ``[B]``: a turn-row estimator's advantage, or masked GAE's terminal reward
    over episodes (``carries``: the rows' :func:`carry_figures`). ``ids``: the rows'
    ``episode``, ``group``, ``state`` and ``step`` ids (Arrow arrays, None where not read),
    ``turns`` their turn indices, ``rewards`` their turns' rewards, ``outcomes`` their terminal
    rewards. A fault of an episode (a turn twice, outcomes or groups that disagree) raises
    :class:`gaecli.errors.GAEInputError` naming the sample."""
    from gaecli.errors import GAEInputError

    rows = TurnRows()
    figures = {"turn": turns, "reward": rewards, "outcome": outcomes, "row": np.arange(len(turns), dtype=np.int64)}
    figures.update(carries or {})
    rows.add(ids["episode"], {**figures, **{name: ids.get(name) for name in CODED[1:]}})
    faults = rows.settle((spec,), ("the input",))
    if faults:
        raise GAEInputError(f"sample {faults[0].row}: {faults[0].message}")
    return rows.results[spec]


def row_spec(spec):
    """The spec each row of masked GAE over episodes is computed by, its terminal reward
    given (:func:`episode_terminals`): ``spec`` without the episodes."""
    from dataclasses import replace

    return replace(spec, episode_by=None, turn_by=None, turn_rewards=None)
