"""The test suite. Its shared helpers live in `tests.harness`, whose asserts pytest rewrites as it
does a test module's, so that a helper's failed check shows its values."""

import pytest

pytest.register_assert_rewrite("tests.harness")
