"""gputop: is my multi-GPU training starved by its own code, or by the machine?"""

__version__ = "0.1.0"
