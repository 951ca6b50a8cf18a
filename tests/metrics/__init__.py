"""Tests of :mod:`attnkit.metrics`, checked against sacreBLEU computed in the test."""
