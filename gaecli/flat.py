"""The numpy form of the advantages (no torch), under its documented name: its home is
:mod:`gaecli.advantages` (:func:`gaecli.advantages.dispatch.gae_flat`)."""

from gaecli.advantages.dispatch import gae_flat

__all__ = ["gae_flat"]
