"""The kernel table under its former name: :mod:`gaecli.advantages.kernels` is its home."""

from gaecli.advantages.kernels import KERNELS, Kernel, available_kernels, device_type, get_kernel, resolve_kernel

__all__ = ["KERNELS", "Kernel", "available_kernels", "device_type", "get_kernel", "resolve_kernel"]
