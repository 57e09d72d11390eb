"""flowkit-impala: the IMPALA algorithm plugin (entry point group ``flowkit``)."""
import flowkit
from flowkit_impala.impala import IMPALA, IMPALAConfig, IMPALAPolicy, MixInReplay

__all__ = ["IMPALA", "IMPALAConfig", "IMPALAPolicy", "MixInReplay"]


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [IMPALA]
