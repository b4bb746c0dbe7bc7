"""The computations ``gae identify`` tries as explanations of a stored column: masked GAE and
every trainer profile (γ and λ fitted), ``reinforce++`` and its trainer profiles (γ fitted), and the outcome
estimators that read only each row's score and its group, grpo under each trainer's score
normalisation (docs/identify.md#the-candidates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import MASKED, PROFILES, profile_variants
from gaecli.advantages.estimator_profiles import OUTCOME_PROFILES, REINFORCE_PROFILES
from gaecli.identify.fit import NORMALIZATIONS

GROUP_KEY = "group"
"""The name the candidates' specs give the sample's group codes."""

SCORE_PRESETS: tuple[tuple[str, str], ...] = (
    ("verl", "verl, skyrl"),
    ("slime", "slime"),
    ("nemo-rl", "nemo-rl"),
    ("roll", "roll"),
    ("areal", "areal"),
    ("openrlhf", "openrlhf"),
)
"""grpo's score normalisations tried: each distinct ``SCORE_NORM_LIKE`` preset (SkyRL's is
verl's), with the trainers it names."""

OUTCOME_ESTIMATORS = ("dr-grpo", "rloo", "maxrl", "opo", "gpg", "reinforce++-baseline")
"""The other grouped estimators tried, each with its own normalisation."""


@dataclass(frozen=True)
class Family:
    """One computation with its free parameters: ``estimator`` (``gae`` with ``semantics``,
    or a critic-free one, grpo's ``score_preset`` a key of
    :data:`gaecli.advantages.normalization.SCORE_NORM_LIKE`), whether γ and λ are fitted,
    whether it needs the groups, and the normalisations tried on its output; ``variants``:
    the GAE variant fields of the sample (:attr:`Sample.variants`) it reads, those its
    profile takes (:func:`gaecli.advantages.contract.profile_variants`: ``areal``'s
    truncation bootstrap, with ``--truncated-col``)."""

    name: str
    estimator: str
    semantics: Optional[str] = None
    score_preset: Optional[str] = None
    fits_gamma: bool = False
    fits_lambda: bool = False
    needs_groups: bool = False
    normalizations: tuple[str, ...] = NORMALIZATIONS
    variants: tuple[str, ...] = ()

    def compute(
        self, sample, gamma: Optional[float], lambd: Optional[float]
    ) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """The raw advantages (float64 ``[N]``, every position as the computation leaves
        it, before any normalisation tried) and returns (None where the computation has
        none to compare) of the ``sample``'s rows."""
        from gaecli.pipeline import compute_packed

        if self.estimator == "gae":  # as gae diff computes a --baseline: with the variants its profile takes
            from gaecli.pipeline import ComparisonSide, old_side_spec

            variants = {name: sample.variants[name] for name in self.variants}
            spec = old_side_spec(ComparisonSide.baseline(self.semantics), gamma, lambd, variants=variants)
            return compute_packed(sample.packed, spec, "native", "cpu")  # (no response mask: SkyRL's loop reads none)
        if self.estimator == "reinforce++":  # its returns as the commands compute them, before its whitening
            from gaecli.advantages.spec import AdvantageSpec

            spec = AdvantageSpec(gamma, estimator="reinforce++", semantics=self.semantics or MASKED)
            return compute_packed(sample.packed, spec, "native", "cpu")[0], None
        return self._outcome(sample), None

    def written(self, sample) -> Optional[np.ndarray]:
        """Where the computation writes its normalised output when it writes through the
        sample's response mask (bool ``[N]``, 0 outside it: SkyRL's ``reinforce++``,
        ``advantages * response_mask``); None: every position as computed (without a response
        mask, and for the computations whose :meth:`compute` writes through it already:
        SkyRL's outcome estimators)."""
        if sample.response is None or self.estimator != "reinforce++" or self.semantics is None:
            return None
        from gaecli.advantages.estimator_profiles import estimator_profile
        from gaecli.advantages.estimators import writes_through_response

        return sample.response if writes_through_response(estimator_profile(self.estimator, self.semantics)) else None

    def _outcome(self, sample) -> np.ndarray:
        from gaecli.advantages.estimators import critic_free_batch
        from gaecli.advantages.normalization import SCORE_NORM_LIKE
        from gaecli.advantages.spec import AdvantageSpec

        rule = SCORE_NORM_LIKE[self.score_preset] if self.score_preset is not None else None
        spec = AdvantageSpec(
            estimator=self.estimator, group_by=GROUP_KEY, whitening_rule=rule, semantics=self.semantics or MASKED
        )
        groups = pa.array(sample.group_codes)
        arrays = (sample.rewards, sample.trainable, sample.offsets, sample.terminal_rewards)
        with np.errstate(all="ignore"):
            advantages, _ = critic_free_batch(spec, *arrays, groups, None, kernel="native", response=sample.response)
        return np.asarray(advantages, dtype=np.float64)

    @property
    def record(self) -> dict:
        """What the computation is, for the JSON document."""
        record = {"name": self.name, "estimator": self.estimator}
        if self.semantics is not None:
            record["semantics"] = self.semantics
        if self.score_preset is not None:
            record["score_normalization"] = self.score_preset
        if self.variants:
            record["variants"] = list(self.variants)
        return record


def families(with_groups: bool, variants=()) -> list[Family]:
    """Every computation tried, in documentation order: masked GAE, the seven profiles (each
    reading those of the GAE variant fields ``variants``, the sample's, its profile takes),
    ``reinforce++`` and its trainer profiles, then (``with_groups``) grpo under each score
    normalisation, the other outcome estimators, and the outcome estimators' trainer profiles.
    The masked contract is tried as it is: identify fits none of its variants."""
    tried = [
        Family(name, "gae", semantics=name, fits_gamma=True, fits_lambda=True,
               variants=tuple(field for field in profile_variants(name) if field in variants))
        for name in (MASKED, *PROFILES)
    ]  # fmt: skip
    tried.append(Family("reinforce++", "reinforce++", fits_gamma=True, normalizations=("none", "batch")))
    tried += [
        Family(f"reinforce++ {name}", "reinforce++", semantics=name, fits_gamma=True, normalizations=("none", "batch"))
        for name in REINFORCE_PROFILES
    ]
    if with_groups:
        tried += [
            Family(f"grpo ({names})", "grpo", score_preset=preset, needs_groups=True, normalizations=("none", "batch"))
            for preset, names in SCORE_PRESETS
        ]
        tried += [
            Family(name, name, needs_groups=True, normalizations=("none", "batch")) for name in OUTCOME_ESTIMATORS
        ]
        tried += [
            Family(f"{estimator} {trainer}", estimator, semantics=trainer, needs_groups=True, normalizations=("none",))
            for estimator, profiles in OUTCOME_PROFILES.items()
            for trainer in profiles
        ]
    return tried
