r"""torch_mz: Matrix Zonotopic Attention (MZAttn) for PyTorch Geometric."""
__version__ = '0.1.0'

__all__ = ['__version__']
