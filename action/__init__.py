"""The GitHub Action's Python side (``action/main.py``); run by ``action.yml``, imported by the tests."""
