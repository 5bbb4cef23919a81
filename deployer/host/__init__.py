"""Host code: what runs on the GPU host.  ``modules/`` are the Ansible modules (ansible.cfg's ``library``),
``module_utils/`` what they share (``module_utils``: Ansible ships each with the modules that import it, as
``ansible.module_utils.<name>``).  Standard library only, and nothing here imports from the rest of ``deployer``:
the controller imports host code, never the other way (tests/unit/test_architecture.py)."""
