set -e
export GIT_AUTHOR_DATE="2024-01-01T00:00:00Z" GIT_COMMITTER_DATE="2024-01-01T00:00:00Z"
cd /work
git init -q -b main
printf 'def feature():\n    return False\n' > feature.py
git add feature.py
git -c user.name="Dev" -c user.email=dev@example.org commit -q -m "Initial commit"
printf 'from flags import ENABLED\n\n\ndef feature():\n    return ENABLED\n' > feature.py
printf 'ENABLED = True\n' > flags.py
