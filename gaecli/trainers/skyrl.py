"""SkyRL's GAE with SkyRL's signature (``skyrl/backends/skyrl_train/utils/ppo_utils.py``,
``compute_gae_advantage_return``, NovaSky-AI/SkyRL ``a956457``; docs/trainers.md#skyrl):
padded ``[B, T]`` response tensors, right-aligned as SkyRL lays them (a shorter response is
preceded by padding columns, ``response_mask`` 0), the masked contract by default or SkyRL's
own computation with ``semantics="skyrl"``; plus :func:`register`, which adds the drop-in to
SkyRL's advantage-estimator registry under a new name. Importing this module does not import
SkyRL."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED
from gaecli.trainers.padded import as_trainable, check_batch, check_semantics, packed_gae

PROFILE = "skyrl"
"""gaecli's profile of SkyRL (docs/semantics.md#the-baselines)."""

PPO_UTILS = ("skyrl.backends.skyrl_train.utils.ppo_utils", "skyrl_train.utils.ppo_utils")
"""Where SkyRL keeps ``register_advantage_estimator``: the module of today's ``skyrl`` package,
then that of the older ``skyrl-train`` one."""


def compute_gae_advantage_return(
    token_level_rewards,
    values,
    response_mask,
    gamma,
    lambd,
    *,
    loss_mask=None,
    semantics: str = MASKED,
    out=None,
    **kwargs,
):
    """SkyRL's ``compute_gae_advantage_return``: ``(advantages, returns)`` ``[B, T]``, the
    advantages whitened (SkyRL's ``masked_whiten``: ``(A − mean)·rsqrt(var + 1e-8)``, the mean
    and Bessel variance over its mask). Other keywords (SkyRL passes ``index``, ``config``...)
    are not read. Tensors stay on their device, in the values' dtype; ``out``: two contiguous
    ``[B, T]`` tensors of the values' dtype to write into (a trainer's reused buffers), returned.

    ``loss_mask`` (a keyword SkyRL's function does not have): the trainable tokens, ``[B, T]``
    0/1 within ``response_mask``; None: every response token (``response_mask``). SkyRL's
    trainer does not pass it to the estimator (docs/trainers.md#skyrl says how to).

    ``semantics="masked"`` (the default): the masked contract over the ``loss_mask`` tokens,
    the outcome (SkyRL puts it on the response's last token, masked or not) on the last
    trainable token, the rewards at masked tokens between trainable ones dropped, the
    advantages whitened over the trainable tokens; advantages and returns exactly 0 at every
    masked and padding position. ``semantics="skyrl"``: SkyRL's loop (every column, the masks
    read nowhere) as :func:`gaecli.baseline_gae_packed` gives it, then SkyRL's whitening over
    ``response_mask`` (tool tokens included), written at every position as SkyRL leaves it."""
    from gaecli.advantages.whiten import whiten

    trainable = response_mask if loss_mask is None else loss_mask
    check_batch("compute_gae_advantage_return", token_level_rewards, values, response_mask, trainable)
    check_semantics(semantics, (MASKED, PROFILE))
    advantages, returns = packed_gae(values, token_level_rewards, trainable, gamma, lambd, semantics, out=out)
    flat = advantages.reshape(-1)
    if semantics == MASKED:
        whitened = whiten(flat, as_trainable(trainable).reshape(-1), written="trainable")
    else:
        whitened = whiten(flat, as_trainable(response_mask).reshape(-1), written="every")
    whitened = whitened.reshape(advantages.shape)
    return (advantages.copy_(whitened), returns) if out is not None else (whitened, returns)


def _ppo_utils():
    """SkyRL's ``ppo_utils`` module; :class:`ImportError` with the fix when SkyRL is missing."""
    import importlib

    errors = []
    for name in PPO_UTILS:
        try:
            return importlib.import_module(name)
        except ImportError as error:
            errors.append(str(error))
    raise ImportError(f"gaecli.trainers.skyrl needs SkyRL for this ({'; '.join(errors)}); pip install skyrl") from None


def _registered(semantics: str):
    """The drop-in in the form SkyRL's registry calls an estimator: every argument a keyword."""

    def gaecli_gae(token_level_rewards, values, response_mask, gamma, lambd, loss_mask=None, **kwargs):
        return compute_gae_advantage_return(
            token_level_rewards, values, response_mask, gamma, lambd, loss_mask=loss_mask, semantics=semantics
        )

    gaecli_gae.__doc__ = compute_gae_advantage_return.__doc__
    return gaecli_gae


def register(name: str = "gaecli_gae", semantics: str = MASKED):
    """Register the drop-in with SkyRL's ``register_advantage_estimator`` under ``name`` (SkyRL
    refuses a name taken already: ``ValueError``) and return the registered function; choose it
    with ``trainer.algorithm.advantage_estimator=NAME``. :class:`ImportError` ("pip install
    skyrl") without SkyRL."""
    check_semantics(semantics, (MASKED, PROFILE))
    return _ppo_utils().register_advantage_estimator(name)(_registered(semantics))
