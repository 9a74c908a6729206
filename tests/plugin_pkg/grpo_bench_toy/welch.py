"""Statistical test ``toy welch``: Welch's t test on the log samples (unpaired)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from bench.stats.stat_tests import StatTest


class ToyWelchTest(StatTest):
    """Welch's t test on the log samples; change = ratio of geometric means - 1."""

    name = "toy welch"
    label = "toy welch t"

    def estimate(self, bg, cg, scale, med_b):
        return math.expm1(float(np.mean(np.log(np.concatenate(cg))) - np.mean(np.log(np.concatenate(bg)))))

    def p(self, bg, cg, scale, med_b):
        return float(sps.ttest_ind(np.log(np.concatenate(cg)), np.log(np.concatenate(bg)), equal_var=False).pvalue)

    def min_p(self, bg, cg):
        return 0.0
