"""slimpar: train models that do not fit the hardware or the network — subnetwork data parallelism
(SDP) and compressed pipeline parallelism (MAPL) on torch.distributed."""

__version__ = "0.1.0"

from slimpar import models, sdp  # noqa: E402
from slimpar.sdp.wrapper import SubnetworkDataParallel  # noqa: E402

__all__ = ["SubnetworkDataParallel", "models", "sdp", "__version__"]
