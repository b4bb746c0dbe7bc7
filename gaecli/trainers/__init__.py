"""Drop-in functions with each trainer's own signature (docs/trainers.md): one module per
trainer, importable without the trainer installed, computing the masked contract by default
(``semantics="masked"``) or, on request, that trainer's own profile, on the tensors' device.

- :mod:`gaecli.trainers.verl`: ``compute_gae_advantage_return``, the outcome estimators,
  ``register``, ``patch`` / ``unpatch``;
- :mod:`gaecli.trainers.openrlhf`: ``get_advantages_and_returns``, ``get_cumulative_returns``;
- :mod:`gaecli.trainers.slime`, :mod:`gaecli.trainers.miles`: ``get_advantages_and_returns_batch``
  (lists of per-sample response tensors, not padded);
- :mod:`gaecli.trainers.skyrl`: ``compute_gae_advantage_return``, ``register``;
- :mod:`gaecli.trainers.areal`: ``compute_token_level_gae``, ``compute_turn_level_gae``;
- :mod:`gaecli.trainers.nemo_rl`: ``GeneralizedAdvantageEstimator``;
- :mod:`gaecli.trainers.roll`: ``compute_gae_advantage_return``. A λ per row (AReaL,
  NeMo-RL) is :mod:`gaecli.trainers.row_lambda`'s.

What they share (the padded layout, the outcome reward's move, the checks of ``semantics``)
is :mod:`gaecli.trainers.padded`. :func:`check` and :func:`credit_metrics` take a batch as a
drop-in does (:mod:`gaecli.trainers.monitor`)."""

__all__ = ["check", "credit_metrics", "CreditMetrics"]


def __getattr__(name: str):
    """:func:`check`, :func:`credit_metrics` and :class:`CreditMetrics` of
    :mod:`gaecli.trainers.monitor`, imported when first asked for."""
    if name in __all__:
        from gaecli.trainers import monitor

        return getattr(monitor, name)
    raise AttributeError(f"module 'gaecli.trainers' has no attribute {name!r}")
