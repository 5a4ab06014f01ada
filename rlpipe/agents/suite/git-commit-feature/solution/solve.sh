#!/bin/bash
cd /work
git add feature.py flags.py
git -c user.name=Oracle -c user.email=oracle@example.org commit -q -m "Add feature flags"
