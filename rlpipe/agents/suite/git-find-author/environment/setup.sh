set -e
export GIT_AUTHOR_DATE="2024-01-01T00:00:00Z" GIT_COMMITTER_DATE="2024-01-01T00:00:00Z"
cd /work
git init -q -b main
printf 'mode=dev\n' > settings.txt
git add settings.txt
git -c user.name="Ana" -c user.email=ana@example.org commit -q -m "Start settings"
printf 'mode=dev\nlevel=2\n' > settings.txt
git add settings.txt
git -c user.name="Bo" -c user.email=bo@example.org commit -q -m "Add level"
printf 'mode=dev\nlevel=2\nMAGIC_TOKEN=abc123\n' > settings.txt
git add settings.txt
git -c user.name="Cy" -c user.email=cy@corp.example commit -q -m "Wire the token"
printf 'mode=prod\nlevel=2\nMAGIC_TOKEN=abc123\n' > settings.txt
git add settings.txt
git -c user.name="Dee" -c user.email=dee@example.org commit -q -m "Go to prod"
printf 'mode=prod\nlevel=3\nMAGIC_TOKEN=zzz999\n' > settings.txt
git add settings.txt
git -c user.name="Eli" -c user.email=eli@example.org commit -q -m "Rotate token"
