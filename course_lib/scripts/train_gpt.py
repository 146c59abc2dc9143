"""Moved to ``course_lib.capstone.train_gpt`` (issue 62: the harness's workers left the
learner's room). ``-m course_lib.scripts.train_gpt`` still runs, and imports, for one release."""
from course_lib.common.deprecation import moved_module

moved_module(globals(), "course_lib.capstone.train_gpt")
