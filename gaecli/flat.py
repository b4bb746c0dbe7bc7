"""The numpy form of the advantages (no torch), under its documented name: its home is
:mod:`gaecli.advantages` (:func:`gaecli.advantages.dispatch.gae_flat`)."""

from gaecli.advantages.baselines import apply_semantics
from gaecli.advantages.contract import BASELINES, WHITEN_EPSILON, check_discount
from gaecli.advantages.dispatch import gae_flat
from gaecli.advantages.layout import last_trainable_index, next_trainable_index

__all__ = [
    "BASELINES",
    "WHITEN_EPSILON",
    "apply_semantics",
    "check_discount",
    "gae_flat",
    "last_trainable_index",
    "next_trainable_index",
]
