-- wrk script: conditional PUTs (If-Match: *) of one scale set's capacity against the emulator.
-- Usage: TOKEN=... wrk -t1 -c8 -d10s -s benches/wrk/conditional-put.lua "$URL"
wrk.method = "PUT"
wrk.body = '{"name":"wrk-0","location":"westeurope","sku":{"name":"Standard_D2s_v5","tier":"Standard","capacity":3}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["If-Match"] = "*"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("TOKEN")

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. "\n")
  end
end
