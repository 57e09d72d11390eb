"""Hooks and the plugin manager (pluggy, project ``flowkit``)."""
from flowkit.hooks.manager import (AlgorithmRef, PluginError, PluginManager, get_plugin_manager,  # noqa: I001
                                   hookimpl, lazy_attrs, register, unregister)

__all__ = ["AlgorithmRef", "PluginError", "PluginManager", "get_plugin_manager", "hookimpl", "lazy_attrs", "register",
           "unregister"]
