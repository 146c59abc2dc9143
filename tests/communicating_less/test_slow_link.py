"""Chapter 11's slow link: bad requests fail before any process starts."""
from __future__ import annotations

import pytest

from course_lib.communicating_less.slow_link import over_slow_link


@pytest.mark.parametrize("job, rates, message", [("nope", [0], "unknown job"),
                                                 ("hooks", [], "rates_mbit"),
                                                 ("hooks", [-1], "rates_mbit")])
def test_bad_requests_fail_early(job, rates, message):
    with pytest.raises(ValueError, match=message):
        over_slow_link(job, rates)
