set -e
export GIT_AUTHOR_DATE="2024-01-01T00:00:00Z" GIT_COMMITTER_DATE="2024-01-01T00:00:00Z"
cd /work
git init -q -b main
printf 'retries: 3\ntimeout: 10\n' > config.yaml
git add config.yaml
git -c user.name="Dev" -c user.email=dev@example.org commit -q -m "Initial config"
printf '# Service\n' > README.md
git add README.md
git -c user.name="Dev" -c user.email=dev@example.org commit -q -m "Add docs"
printf 'retries: 0\ntimeout: 10\n' > config.yaml
git add config.yaml
git -c user.name="Dev" -c user.email=dev@example.org commit -q -m "Tune retries"
printf '## 1.0\n' > CHANGELOG.md
git add CHANGELOG.md
git -c user.name="Dev" -c user.email=dev@example.org commit -q -m "Add changelog"
