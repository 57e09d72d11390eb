"""flowkit-atari: the env preset ``atari`` plugin (entry point group ``flowkit``).

``env.preset=atari``: DeepMind's preprocessing of ale-py's games (:mod:`flowkit_atari.preset`,
imported when a run uses the preset: this entry-point module imports neither torch nor
Gymnasium)."""
import flowkit


@flowkit.hookimpl
def flowkit_add_env_presets():
    return [flowkit.EnvPreset("atari", "flowkit_atari.preset",
                              "DeepMind's Atari preprocessing of an ALE id (plugins/atari, docs/envs.md)")]
