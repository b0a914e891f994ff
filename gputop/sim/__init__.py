"""The simulated machine (`--simulate`).  Only the default profile's name lives here: the command line
offers it without loading the profiles (a real run never loads the simulator)."""

DEFAULT_PROFILE = "h100-sxm-8"
