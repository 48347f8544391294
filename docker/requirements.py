"""Print the project's requirements (pyproject.toml's dependencies and the named extras), one a
line, for the Dockerfile's dependency layer: it is rebuilt only when pyproject.toml changes, not
with every change to the sources.

    python docker/requirements.py [EXTRA ...] < pyproject.toml
"""

import sys
import tomllib

project = tomllib.load(sys.stdin.buffer)["project"]
extras = project.get("optional-dependencies", {})
unknown = [name for name in sys.argv[1:] if name not in extras]
if unknown:
    sys.exit(f"requirements.py: no extra {', '.join(unknown)} in pyproject.toml")
for requirement in [*project["dependencies"], *(r for n in sys.argv[1:] for r in extras[n])]:
    print(requirement)
