"""Hatchling metadata hook: a package's dependencies, with the repository's one version filled in.

The four packages release together from the version in the repository's ``VERSION`` file, so a
sibling is pinned to exactly that version. A package built by hatchling lists ``dependencies``
in ``project.dynamic`` and writes them in its ``[tool.hatch.metadata.hooks.custom]`` table, in
the template syntax of scikit-build-core's template provider (which megaindex's build uses)::

    dependencies = ["megafmt=={project[version]}", "torch>=2.4"]

Each entry is formatted with the project's metadata, the version already read from ``VERSION``.

A package reaches this file and ``VERSION`` through links in its own folder
(``pinned_dependencies.py``, ``VERSION``), named in its pyproject.toml by those local paths, and
its sdist carries the files linked to under the same names (hatchling: ``force-include`` of the
targets; scikit-build-core: ``sdist.resolve-symlinks``). So one pyproject.toml builds both from
the repository, where the root files stay the one source, and from an unpacked sdist, which needs
nothing outside it. The simpler alternatives fail: a path such as ``../../VERSION`` leaves the
unpacked sdist, and a link alone is stored as a link (dangling once unpacked) by hatchling. The
link is not named ``hatch_build.py``: hatchling's sdist always adds a file of that name as found,
the link itself.
"""

from __future__ import annotations

from typing import Any

from hatchling.metadata.plugin.interface import MetadataHookInterface


class PinnedDependencies(MetadataHookInterface):
    """Fills ``project.dependencies`` from the hook's ``dependencies`` templates."""

    def update(self, metadata: dict[str, Any]) -> None:
        templates = self.config.get("dependencies")
        if not isinstance(templates, list):
            raise TypeError(
                f"{self.root}/pyproject.toml: [tool.hatch.metadata.hooks.custom] needs "
                f"'dependencies', a list of requirement templates; found {templates!r}"
            )
        metadata["dependencies"] = [template.format(project=metadata) for template in templates]
