"""flowkit-minigrid: the env preset ``minigrid`` plugin (entry point group ``flowkit``).

``env.preset=minigrid``: MiniGrid's gridworlds (Chevalier-Boisvert et al. 2023, arXiv
2306.13831) with the agent's 7x7 view as the observation (:mod:`flowkit_minigrid.preset`,
imported when a run uses the preset: this entry-point module imports neither torch nor
Gymnasium)."""
import flowkit


@flowkit.hookimpl
def flowkit_add_env_presets():
    return [flowkit.EnvPreset("minigrid", "flowkit_minigrid.preset",
                              "MiniGrid's 7x7 egocentric view as float32[7, 7, 3] codes (plugins/minigrid)")]
