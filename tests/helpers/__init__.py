"""Helpers shared by the tests, one module per area; imported as ``from tests.helpers.X import``.

* :mod:`tests.helpers.bad_files`: damaged model-folder files and the errors they must give;
* :mod:`tests.helpers.corpora`: the BLEU test corpora (Multi30k references, corrupted copies);
* :mod:`tests.helpers.decoding`: tiny translation configs, padded id batches and the copy-task
  model trained to a criterion;
* :mod:`tests.helpers.generation`: a tiny random GPT-2 folder and byte-level tokenizers;
* :mod:`tests.helpers.gpt_parity`: token comparisons with Hugging Face guarded against near
  ties (a step counts only while its top-2 logit gap exceeds 10x the measured logit difference);
* :mod:`tests.helpers.gpt`: padded id batches (left/right), a byte-level BPE tokenizer and a
  Hugging Face GPT-2 folder with random weights;
* :mod:`tests.helpers.metrics`: sacreBLEU's results for the test corpora and comparisons;
* :mod:`tests.helpers.scripts`: import a script of ``scripts/`` by name;
* :mod:`tests.helpers.serve`: an ``attnkit serve`` app or process for the server tests;
* :mod:`tests.helpers.training`: the tiny copy-task training configs, CLI subprocesses, weights;
* :mod:`tests.helpers.viz`: a tiny translation model folder, the MiniLM folder and a PNG check.

Fixtures stay in the ``conftest.py`` of their folder; no test imports a ``conftest``.

``tests`` is a package (``tests/__init__.py``), so pytest puts the repository root on
``sys.path`` and these imports work from every test folder.
"""
