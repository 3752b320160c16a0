"""Started with every Python process of a test that puts this folder on PYTHONPATH: with
``SLIMPAR_TEST_RENDEZVOUS=1``, point-to-point follows NCCL's rules (tests/rendezvous_p2p.py)."""

import os

if os.environ.get("SLIMPAR_TEST_RENDEZVOUS") == "1":
    from tests.rendezvous_p2p import install

    install()
