"""copy_errors reads the logits of the row before each taught token, and counts what it should."""
import unittest

import numpy as np

import copy_errors
import tasks
import train

VOCAB = tasks.VOCAB


def one_hot(tokens):
    logits = np.zeros((len(tokens), VOCAB))
    logits[np.arange(len(tokens)), tokens] = 1.0
    return logits


def oracle(row):
    """A forward that ranks first, at each row, the token that follows it in `row`."""
    return lambda tokens: one_hot(np.append(row[1:len(tokens)], tasks.EOS))


class CopyErrorsTest(unittest.TestCase):
    def test_a_model_that_knows_the_next_token_makes_no_error(self):
        x, y, _ = train.batch(["values"], 256, 1, copy_errors.FIRST_SEED)
        row, targets = x[0].numpy(), y[0].numpy()
        wrong, taught = copy_errors.row_errors(oracle(row), row, targets)
        self.assertEqual(wrong, 0)
        self.assertEqual(taught, int(np.sum(targets != -100)))
        self.assertGreater(taught, 10)

    def test_a_model_that_repeats_the_current_token_is_wrong_where_the_next_one_differs(self):
        x, y, _ = train.batch(["values"], 256, 1, copy_errors.FIRST_SEED)
        row, targets = x[0].numpy(), y[0].numpy()
        wrong, taught = copy_errors.row_errors(lambda tokens: one_hot(tokens), row, targets)
        taught_rows = np.flatnonzero(targets != -100)
        self.assertEqual(wrong, int(np.sum(row[taught_rows] != targets[taught_rows])))
        self.assertGreater(wrong, 0)

    def test_form_errors_sum_the_rows_and_count_those_with_an_error(self):
        def forward(tokens):  # even lengths: the next token (right); odd: the current one
            if len(tokens) % 2 == 0:
                return one_hot(np.append(tokens[1:], tasks.EOS))
            return one_hot(tokens)

        rows = []
        for i in range(4):
            x, y, _ = train.batch(["values"], 256, 1, copy_errors.FIRST_SEED + i)
            rows.append((x[0].numpy(), y[0].numpy()))
        per_row = [copy_errors.row_errors(forward, r, t) for r, t in rows]
        wrong, taught, bad = copy_errors.form_errors(forward, "values", 256, 4)
        self.assertEqual(wrong, sum(w for w, _ in per_row))
        self.assertEqual(taught, sum(t for _, t in per_row))
        self.assertEqual(bad, sum(w > 0 for w, _ in per_row))
        self.assertGreater(bad, 0)


if __name__ == "__main__":
    unittest.main()
