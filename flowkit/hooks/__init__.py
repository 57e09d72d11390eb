"""Hooks and the plugin manager (pluggy, project ``flowkit``)."""
from flowkit.hooks.manager import PluginError, PluginManager, get_plugin_manager, hookimpl, register, unregister

__all__ = ["PluginError", "PluginManager", "get_plugin_manager", "hookimpl", "register", "unregister"]
